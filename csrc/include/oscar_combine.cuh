// The decode kernel's body, the split merge done by the last CTA of each (b, kv head), and the host launcher.
#pragma once
#include <cuda_runtime.h>

namespace oscar {

// One row's window partial (slot num_splits, natural basis) for the merge: its m, l and 8 channels of o.
struct WindowPart {
  float m, l, o[8];
};

template <int D>
__device__ __forceinline__ WindowPart load_window_part(const DecodeParams& p, int64_t base, int rows, int r, int chunk) {
  constexpr int D8 = 8;
  WindowPart x;
  const int64_t s = base + p.num_splits;
  x.m = __ldcg(p.part_ml + s * 2 * rows + r);
  x.l = __ldcg(p.part_ml + (s * 2 + 1) * rows + r);
  const float4* src = reinterpret_cast<const float4*>(p.part_o + (s * rows + r) * D) + 2 * chunk;
  const float4 a = __ldcg(src), b = __ldcg(src + 1);
  const float o[D8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < D8; ++i) x.o[i] = o[i];
  return x;
}

// Last CTA of (b, kv head): out = (fwht(O_q) / sqrt(D) + w_r o_r) / L over the quantized splits' partials (rotated
// basis) and the window's (natural basis), each weighted 2^(m_s - M). A thread takes 8 channels of a row
// (16-byte loads); with few rows, `parts` threads share a row item's splits. Each thread merges its splits online
// in chunks of kChunk whose loads (m, l, 8 channels of o) are all in flight together, so a merge costs
// splits / (parts kChunk) rounds of L2 latency; the parts are combined through shared memory, the window partial
// (loaded before the rounds) joins there, and the rotation back runs in registers (fwht_lanes).
// quant: the row's quantized partials (slots 0 .. quant - 1); the window's is slot num_splits. stamp: trace slot 5.
template <int D, int NT, typename T, class Smem>
__device__ void combine_splits(const DecodeParams& p, int64_t bh, Smem& sm, int quant, bool stamp = true) {
  constexpr int kPerRow = D / 8, kSlots = kThreads / kPerRow, kChunk = 8;  // threads per row, rows per pass
  const int rows = p.group * p.lq;
  const int64_t base = bh * (p.num_splits + 1);
  const float* ml = p.part_ml;
  float* part_o = &sm.acc[0][0][0];  // [parts][rows][D]
  float* part_m = &sm.m[0][0];       // [parts][rows]
  float* part_l = &sm.l[0][0];
  const int chunk = threadIdx.x % kPerRow, slot = threadIdx.x / kPerRow;
  const int parts = rows >= kSlots ? 1 : kSlots / rows, per_pass = kSlots / parts, part_id = slot / per_pass;
  WindowPart win = {};
  if (slot < rows) win = load_window_part<D>(p, base, rows, slot, chunk);  // the first pass of the final loop
  for (int r = slot % per_pass; r < rows && part_id < parts; r += per_pass) {
    float m = kNegInit, l = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int s0 = part_id; s0 < quant; s0 += kChunk * parts) {
      float ms[kChunk], ls[kChunk];
      float4 x0[kChunk], x1[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int s = s0 + k * parts;
        ms[k] = kNegInit, ls[k] = 0.f;
        x0[k] = x1[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (s < quant) {
          ms[k] = __ldcg(ml + (base + s) * 2 * rows + r);
          ls[k] = __ldcg(ml + ((base + s) * 2 + 1) * rows + r);
          const float4* src = reinterpret_cast<const float4*>(p.part_o + ((base + s) * rows + r) * D) + 2 * chunk;
          x0[k] = __ldcg(src), x1[k] = __ldcg(src + 1);
        }
      }
      float mc = m;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) mc = fmaxf(mc, ms[k]);
      const float a = exp2f(m - mc);
      l *= a;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] *= a;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const float e = exp2f(ms[k] - mc);
        l += e * ls[k];
        o[0] += e * x0[k].x, o[1] += e * x0[k].y, o[2] += e * x0[k].z, o[3] += e * x0[k].w;
        o[4] += e * x1[k].x, o[5] += e * x1[k].y, o[6] += e * x1[k].z, o[7] += e * x1[k].w;
      }
      m = mc;
    }
    float4* dst = reinterpret_cast<float4*>(part_o + (part_id * rows + r) * D) + 2 * chunk;
    dst[0] = make_float4(o[0], o[1], o[2], o[3]);
    dst[1] = make_float4(o[4], o[5], o[6], o[7]);
    if (chunk == 0) part_m[part_id * rows + r] = m, part_l[part_id * rows + r] = l;
  }
  if (stamp) trace_stamp(p, 5);
  __syncthreads();
  const float inv = p.rotate ? rsqrtf(static_cast<float>(D)) : 1.f;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  for (int r0 = 0; r0 < rows; r0 += kSlots) {  // uniform trip count: every lane of a row takes part in the shuffles
    const int r = r0 + slot;
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, big = win.m, l = 0.f;
    if (r < rows) {
      if (r0 > 0) win = load_window_part<D>(p, base, rows, r, chunk);
      big = win.m;
      for (int k = 0; k < parts; ++k) big = fmaxf(big, part_m[k * rows + r]);
#pragma unroll 1
      for (int k = 0; k < parts; ++k) {
        const float e = exp2f(part_m[k * rows + r] - big);
        const float4* src = reinterpret_cast<const float4*>(part_o + (k * rows + r) * D) + 2 * chunk;
        const float4 x0 = src[0], x1 = src[1];
        l += e * part_l[k * rows + r];
        x[0] += e * x0.x, x[1] += e * x0.y, x[2] += e * x0.z, x[3] += e * x0.w;
        x[4] += e * x1.x, x[5] += e * x1.y, x[6] += e * x1.z, x[7] += e * x1.w;
      }
    }
    if (p.rotate) fwht_lanes<D>(x);
    if (r < rows) {
      const float w_res = exp2f(win.m - big);
      const float inv_l = 1.f / (l + w_res * win.l);
      T y[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = from_float<T>((x[i] * inv + w_res * win.o[i]) * inv_l);
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + (head * p.lq + r / p.group) * D + 8 * chunk) =
          *reinterpret_cast<const uint4*>(y);
    }
  }
}

__device__ __forceinline__ int atomic_add_acq_rel(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// This CTA's `arrivals` partials of row bh are written; true in the CTA that brings the count to `expected` (it
// merges). The barrier orders every thread's partial before thread 0's arrival, an acq_rel atomic: it releases them
// to the last CTA and, in that one, acquires the other CTAs' (the pattern of CUTLASS's GenericBarrier; a
// sequentially consistent fence in every thread, as before, measured 0.3-1.3 us slower, run 34).
template <class Smem>
__device__ __forceinline__ bool arrive(const DecodeParams& p, int64_t bh, int arrivals, int expected, Smem& sm) {
  __syncthreads();
  if (threadIdx.x == 0) sm.last = atomic_add_acq_rel(p.counters + bh, arrivals) + arrivals == expected;
  __syncthreads();
  return sm.last;
}

// Grid (num_splits + 1, B * Hkv) with window_cta: CTA 0 attends to the full-precision window (its partial is
// slot num_splits), CTA x > 0 to quantized split x - 1. Else grid (max(num_splits, 1), B * Hkv): CTA x attends
// to split x and the last one also to the window first. The last CTA to finish merges all partials
// (threadFenceReduction pattern). (Letting the window CTA, idle after its window, merge the splits as their flags
// came up instead ran 2-3 us slower: its polling slowed the split beside it on its SM, run 33.)
template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D, NT>& sm = *reinterpret_cast<DecodeSmem<D, NT>*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  // Window first in its own CTA (its code runs once per step, from a cold instruction cache: 4-13 us, in parallel
  // with the splits) or folded into the last split's CTA (batched steps, where a slot per row is too dear).
  const bool window = p.window_cta ? blockIdx.x == 0 : blockIdx.x == gridDim.x - 1;
  const int split = p.window_cta ? static_cast<int>(blockIdx.x) - 1 : static_cast<int>(blockIdx.x);
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  int arrivals = 0;
  WarpState<D, NT> w;
  trace_stamp(p, 0);
  if (window) {
    init_state<D, NT>(w);
    residual_part<D, NT, T>(p, b, h, w, sm.res[warp]);
    finish_state<D, NT>(w);
    write_partial<D, NT>(p, bh, p.num_splits, w, sm);
    ++arrivals;
  }
  if (split >= 0 && split < p.num_splits) {
    if (window) __syncthreads();  // the window's write_partial read sm.acc, which the stages alias
    quantized_part<D, NT, T>(p, b, bh, split, w, sm);
    finish_state<D, NT>(w);
    trace_stamp(p, 2);
    write_partial<D, NT>(p, bh, split, w, sm);
    ++arrivals;
  }
  const bool last = arrive(p, bh, arrivals, p.num_splits + 1, sm);
  trace_stamp(p, 3);
  if (!last) return;
  combine_splits<D, NT, T>(p, bh, sm, p.num_splits);
  if (threadIdx.x == 0) p.counters[bh] = 0;  // ready for the next call
  trace_stamp(p, 4);
}

// Stream mode (batched steps): a persistent grid of CTAs (2-3 per SM), each taking an equal share of the units of
// all rows laid end to end (`row_units` per row: its 32-token groups, then its window's weight in groups), so there
// is no last, partly filled wave of split CTAs and no CTA launch per split. A CTA first attends to the windows of
// the rows that end in its range, then streams its groups: each warp's cp.async pipeline runs on across row
// boundaries (StreamProducer), and at a boundary the CTA writes the row's partial (slot: CTA - the row's first CTA)
// and arrives; the last of a row's CTAs merges it (its next groups already in flight).
#ifndef OSCAR_STREAM_WINDOW_LAST
#define OSCAR_STREAM_WINDOW_LAST 0  // an experiment's build flag: a stream CTA's windows after its groups, not before
#endif
__device__ __forceinline__ int stream_cta_of(int64_t x, int64_t total, int n) {  // the CTA whose range holds unit x
  return static_cast<int>(((x + 1) * n - 1) / total);
}

// One row's part of a stream CTA's range [x, e): units [u0, u1) of `row`, of which groups [u0, gend) are quantized
// groups of its sequence (below tokens / 32 and the sequence's kv_len). Unit positions fit in 32 bits (the host
// checks rows * row_units < 2^31): no 64-bit divisions on the way.
struct StreamSegment {
  int row, u0, u1, gend;
  __device__ __forceinline__ StreamSegment(const DecodeParams& p, int x, int e) {
    row = x / p.row_units;
    const int r0 = row * p.row_units;
    u0 = x - r0;
    u1 = min(p.row_units, e - r0);
    const int kv_groups = (p.kv_lens[row / p.kv_heads] + kGroup - 1) / kGroup;
    gend = min(min(u1, p.tokens / kGroup), kv_groups);
  }
  __device__ __forceinline__ int end(const DecodeParams& p) const { return row * p.row_units + u1; }
};

// Issue group g of the [B, Hkv, T / 32] layout (gn: its norms' group in [B, T / 32]) into stage `st`: GroupSource's chunks, addressed from the kernel
// parameters directly (no per-row pointers held in registers: the stream kernel has ~18 to spare).
template <int D>
__device__ __forceinline__ void issue_stream_group(const DecodeParams& p, unsigned char* st, int64_t g, int64_t gn,
                                                   uint64_t policy) {
  using L = Stage<D>;
  constexpr int kSZ = D / 8;
  const int lane = threadIdx.x & 31;
  const uint32_t dst = smem_addr(st) + 16 * lane;
  auto copy = [&](uint32_t to, const unsigned char* from) {
#if OSCAR_EVICT_FIRST
    cp_async16_hint(to, from, policy);
#else
    cp_async16(to, from);
#endif
  };
  const unsigned char* kc = reinterpret_cast<const unsigned char*>(p.kc) + g * 8 * D + 16 * lane;
  const unsigned char* vc = reinterpret_cast<const unsigned char*>(p.vc) + g * 8 * D + 16 * lane;
#pragma unroll
  for (int j = 0; j < D / 64; ++j) copy(dst + L::kKC + 512 * j, kc + 512 * j);
#pragma unroll
  for (int j = 0; j < D / 64; ++j) copy(dst + L::kVC + 512 * j, vc + 512 * j);
  if (lane < D / 4) {
    const int64_t sz = g * 2 * D + 16 * (lane % kSZ);
    copy(dst + L::kKS, reinterpret_cast<const unsigned char*>(lane < kSZ ? p.ks : p.kz) + sz);
    copy(dst + L::kVS, reinterpret_cast<const unsigned char*>(lane < kSZ ? p.vs : p.vz) + sz);
  }
  if (lane < 8)
    copy(dst + L::kNorm, reinterpret_cast<const unsigned char*>(p.norms) + gn * 128 + 16 * lane);
}

// A warp's cp.async issues over its groups (u0 + warp, + kWarps, ... per segment) in the order the warp consumes
// them, kStages - 1 ahead, across segments. Kept: the row's first group in the [B, Hkv, T / 32] layout, the
// sequence, the segment's ends.
template <int D>
struct StreamProducer {
  int64_t g0;
  int b, gi, gend, end;
  bool done;
  __device__ __forceinline__ StreamProducer(const DecodeParams& p, int s, int e) : done(false) {
    enter(p, StreamSegment(p, s, e));
    settle(p, e);
  }
  __device__ __forceinline__ void enter(const DecodeParams& p, const StreamSegment& seg) {
    g0 = static_cast<int64_t>(seg.row) * (p.tokens / kGroup), b = seg.row / p.kv_heads;
    gend = seg.gend, end = seg.end(p), gi = seg.u0 + (threadIdx.x >> 5);
  }
  __device__ __forceinline__ void settle(const DecodeParams& p, int e) {  // on to a segment with a group for us
    while (gi >= gend) {
      if (end >= e) {
        done = true;
        return;
      }
      enter(p, StreamSegment(p, end, e));
    }
  }
  __device__ __forceinline__ void issue_next(const DecodeParams& p, int e, unsigned char* st, uint64_t policy) {
    if (done) return;
    issue_stream_group<D>(p, st, g0 + gi, static_cast<int64_t>(b) * (p.tokens / kGroup) + gi, policy);
    gi += kWarps;
    settle(p, e);
  }
};

template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_stream_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  StreamSmem<D, NT>& sm = *reinterpret_cast<StreamSmem<D, NT>*>(smem_raw);
  const int warp = threadIdx.x >> 5, n = static_cast<int>(gridDim.x), R = p.row_units;
  const int64_t total = static_cast<int64_t>(p.rows) * R;
  const int s = static_cast<int>(blockIdx.x * total / n), e = static_cast<int>((blockIdx.x + 1) * total / n);
  if (s >= e) return;
  trace_stamp(p, 0);
  auto first_cta = [&](int row) { return stream_cta_of(static_cast<int64_t>(row) * R, total, n); };
  auto spans = [&](int row) { return stream_cta_of(static_cast<int64_t>(row) * R + R - 1, total, n) - first_cta(row) + 1; };
  WarpState<D, NT> w;
  auto windows = [&]() {
    for (int row = s / R; (row + 1) * R <= e; ++row) {  // rows ending here
      __syncthreads();  // the window tiles alias the stages and acc, which a merge may have just read
      init_state<D, NT>(w);
      residual_part<D, NT, T>(p, row / p.kv_heads, row % p.kv_heads, w, sm.res[warp]);
      finish_state<D, NT>(w);
      write_partial<D, NT>(p, row, p.num_splits, w, sm);
      if (arrive(p, row, 1, spans(row) + 1, sm)) {
        combine_splits<D, NT, T>(p, row, sm, spans(row), false);
        if (threadIdx.x == 0) p.counters[row] = 0;
      }
    }
  };
  if (!OSCAR_STREAM_WINDOW_LAST) windows();
  unsigned char (*stages)[Stage<D>::kBytes] = sm.stage[warp];
  QueryLoads<D, NT> ql;
  query_load<D, NT, T>(p, (s / R) / p.kv_heads, (s / R) % p.kv_heads, ql);
#if OSCAR_EVICT_FIRST
  const uint64_t policy = l2_evict_first_policy();
#else
  const uint64_t policy = 0;
#endif
  StreamProducer<D> pr(p, s, e);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    pr.issue_next(p, e, stages[st], policy);
    cp_async_commit();
  }
  int k = 0;
  for (int x = s; x < e;) {
    const StreamSegment seg(p, x, e);
    const int kv_len = p.kv_lens[seg.row / p.kv_heads];
    uint32_t qf[D / 16][NT][2];
    query_fragments<D, NT, T>(ql, p.rotate, sm.q, qf);  // every warp: a barrier
    if (x == s) trace_stamp(p, 1);
    init_state<D, NT>(w);
    for (int gi = seg.u0 + warp; gi < seg.gend; gi += kWarps, ++k) {
      pr.issue_next(p, e, stages[(k + kStages - 1) % kStages], policy);
      cp_async_commit();
      cp_async_wait<kStages - 1>();
      __syncwarp();
      group_step<D, NT>(stages[k % kStages], qf, w, kv_len - kGroup * gi, p.scale_log2);
      __syncwarp();  // the stage is refilled next
    }
    x = seg.end(p);
    const bool more = x < e;
    if (more) {  // the next row's query, in flight while this row's partial is written
      query_load<D, NT, T>(p, (x / R) / p.kv_heads, (x / R) % p.kv_heads, ql);
    } else {
      trace_stamp(p, 2);
    }
    finish_state<D, NT>(w);
    write_partial<D, NT>(p, seg.row, static_cast<int>(blockIdx.x) - first_cta(seg.row), w, sm);
    const int quant = spans(seg.row);
    const bool last = arrive(p, seg.row, 1, quant + 1, sm);
    if (!more) trace_stamp(p, 3);
    if (last) {
      combine_splits<D, NT, T>(p, seg.row, sm, quant, !more);
      if (threadIdx.x == 0) p.counters[seg.row] = 0;
      if (!more) trace_stamp(p, 4);
    }
  }
  if (OSCAR_STREAM_WINDOW_LAST) windows();  // the pipeline is drained: every issued group was consumed
}

namespace {
// Devices on which a specialization's shared-memory limit is raised (per kernel: split, stream). Internal linkage on
// purpose: a function-local static of an inline template is one symbol across every loaded module (STB_GNU_UNIQUE),
// so a second build of the same kernels in one process (min_blocks=2 beside 3) skipped its own setup and failed to
// launch (run 28).
template <int D, int NT, typename T, bool Stream>
bool decode_configured[64] = {};
}  // namespace

// stream_ctas > 0: decode_stream_kernel over that many CTAs (p.rows, p.row_units set); else the split kernel.
template <int D, int NT, typename T>
cudaError_t launch_decode_nt(const DecodeParams& p, int batch, cudaStream_t stream, int stream_ctas) {
  const bool streamed = stream_ctas > 0;
  const size_t smem = streamed ? sizeof(StreamSmem<D, NT>) : sizeof(DecodeSmem<D, NT>);
  int dev = 0;
  cudaGetDevice(&dev);
  bool* configured = streamed ? decode_configured<D, NT, T, true> : decode_configured<D, NT, T, false>;
  if (dev < 0 || dev >= 64 || !configured[dev]) {
    const cudaError_t e =
        streamed ? cudaFuncSetAttribute(decode_stream_kernel<D, NT, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem))
                 : cudaFuncSetAttribute(decode_split_kernel<D, NT, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) configured[dev] = true;
  }
  if (streamed) {
    decode_stream_kernel<D, NT, T><<<stream_ctas, kThreads, smem, stream>>>(p);
  } else {
    const int ctas = p.window_cta ? p.num_splits + 1 : max(p.num_splits, 1);
    decode_split_kernel<D, NT, T><<<dim3(ctas, batch * p.kv_heads), kThreads, smem, stream>>>(p);
  }
  return cudaGetLastError();
}

// Host: one launch (splits, the window folded into the last split's CTA, the merge in the last CTA to
// finish; or the stream kernel over stream_ctas CTAs). batch = B. Returns the first CUDA error.
template <int D, typename T>
cudaError_t launch_decode(const DecodeParams& p, int batch, cudaStream_t stream, int stream_ctas) {
  const int rows = p.group * p.lq;
  if (rows > 16 || p.num_splits + 1 > kMaxSplits) return cudaErrorInvalidValue;
  if (stream_ctas > 0 && (p.row_units <= 0 || p.rows != batch * p.kv_heads)) return cudaErrorInvalidValue;
  return rows <= 8 ? launch_decode_nt<D, 1, T>(p, batch, stream, stream_ctas)
                   : launch_decode_nt<D, 2, T>(p, batch, stream, stream_ctas);
}

}  // namespace oscar
