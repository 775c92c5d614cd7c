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

// Groups of a two-level merge: ceil(num_splits / merge_group) with merge_group > 0 and the window in its own CTA, else
// 0 (one level: the last CTA merges every partial).
__device__ __forceinline__ int merge_groups(const DecodeParams& p) {
  return p.merge_group > 0 && p.window_cta ? (p.num_splits + p.merge_group - 1) / p.merge_group : 0;
}

// Whether a launch takes the two-level merge: then the kernel is the kGroups = true instantiation. The one-level
// kernel (kGroups = false) has no group-merge code at all: compiled in and unused, that code (~2,100 SASS
// instructions) slowed batch-1 steps after the read-only flush, its instructions fetched from DRAM.
__host__ __device__ __forceinline__ bool grouped_launch(const DecodeParams& p) {
  return p.merge_group > 0 && p.window_cta;
}

// Phase 1 of a merge: the partials in slots first + i * stride (i < count) merged online into `parts` per-row
// results in shared memory (unnormalized o, m, l). A thread takes 8 channels of a row (16-byte loads); with few rows,
// `parts` threads share a row item's slots. Each thread merges its slots online in chunks of kChunk whose loads (m, l,
// 8 channels of o) are all in flight together, so a merge costs count / (parts kChunk) rounds of L2 latency.
template <int D, int NT>
__device__ int merge_slots(const DecodeParams& p, int64_t base, int first, int count, int stride,
                           DecodeSmem<D, NT>& sm) {
  constexpr int kPerRow = D / 8, kSlots = kThreads / kPerRow, kChunk = 8;  // threads per row, rows per pass
  const int rows = p.group * p.lq;
  const float* ml = p.part_ml;
  float* part_o = &sm.acc[0][0][0];  // [parts][rows][D]
  float* part_m = &sm.m[0][0];       // [parts][rows]
  float* part_l = &sm.l[0][0];
  const int chunk = threadIdx.x % kPerRow, slot = threadIdx.x / kPerRow;
  const int parts = rows >= kSlots ? 1 : kSlots / rows, per_pass = kSlots / parts, part_id = slot / per_pass;
  for (int r = slot % per_pass; r < rows && part_id < parts; r += per_pass) {
    float m = kNegInit, l = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int i0 = part_id; i0 < count; i0 += kChunk * parts) {
      float ms[kChunk], ls[kChunk];
      float4 x0[kChunk], x1[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int i = i0 + k * parts;
        const int64_t s = base + first + static_cast<int64_t>(i) * stride;
        ms[k] = kNegInit, ls[k] = 0.f;
        x0[k] = x1[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < count) {
          ms[k] = __ldcg(ml + s * 2 * rows + r);
          ls[k] = __ldcg(ml + (s * 2 + 1) * rows + r);
          const float4* src = reinterpret_cast<const float4*>(p.part_o + (s * rows + r) * D) + 2 * chunk;
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
  return parts;
}

// One row's phase-1 results for a thread's 8 channels: (max, l, o) of the `parts` shared-memory parts, each
// weighted 2^(m_k - max) (max starting from `big`).
template <int D, int NT>
__device__ __forceinline__ float sum_parts(const DecodeSmem<D, NT>& sm, int parts, int rows, int r, int chunk,
                                           float big, float& l, float (&x)[8]) {
  const float* part_o = &sm.acc[0][0][0];
  const float* part_m = &sm.m[0][0];
  const float* part_l = &sm.l[0][0];
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
  return big;
}

// The first level of a two-level merge (p.merge_group > 0): the last CTA of a group of merge_group quantized splits
// merges the group's partials into the group's first slot (the same format: unnormalized o in the rotated basis, m, l).
template <int D, int NT>
__device__ void combine_group(const DecodeParams& p, int64_t bh, int first, int count, DecodeSmem<D, NT>& sm) {
  constexpr int kPerRow = D / 8, kSlots = kThreads / kPerRow;
  const int rows = p.group * p.lq;
  const int64_t base = bh * (p.num_splits + 1), s = base + first;
  const int parts = merge_slots<D, NT>(p, base, first, count, 1, sm);
  __syncthreads();
  const int chunk = threadIdx.x % kPerRow, slot = threadIdx.x / kPerRow;
  for (int r = slot; r < rows; r += kSlots) {
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, l = 0.f;
    const float big = sum_parts<D, NT>(sm, parts, rows, r, chunk, kNegInit, l, x);
    float4* dst = reinterpret_cast<float4*>(p.part_o + (s * rows + r) * D) + 2 * chunk;
    __stcg(dst, make_float4(x[0], x[1], x[2], x[3]));
    __stcg(dst + 1, make_float4(x[4], x[5], x[6], x[7]));
    if (chunk == 0) __stcg(p.part_ml + s * 2 * rows + r, big), __stcg(p.part_ml + (s * 2 + 1) * rows + r, l);
  }
}

// Last CTA of (b, kv head): out = (fwht(O_q) / sqrt(D) + w_r o_r) / L over the quantized splits' partials (rotated
// basis; O_q as it is when the model's weights carry V's rotation, !rotate_out) and the window's (the model's basis),
// each weighted 2^(m_s - M). Phase 1 (merge_slots) over the quantized slots, or over the groups' first slots after a
// two-level merge's first level; then the parts are combined through shared memory, the window partial (loaded before
// phase 1) joins there, and the rotation back runs in registers (fwht_lanes).
template <int D, int NT, typename T, bool kGroups>
__device__ void combine_splits(const DecodeParams& p, int64_t bh, DecodeSmem<D, NT>& sm, bool dry = false) {
  constexpr int kPerRow = D / 8, kSlots = kThreads / kPerRow;
  const int rows = p.group * p.lq, quant = p.num_splits;
  const int64_t base = bh * (p.num_splits + 1);
  const int chunk = threadIdx.x % kPerRow, slot = threadIdx.x / kPerRow;
  WindowPart win = {};
  if (slot < rows) win = load_window_part<D>(p, base, rows, slot, chunk);  // the first pass of the final loop
  const int stride = kGroups && merge_groups(p) > 0 ? p.merge_group : 1;
  const int parts = merge_slots<D, NT>(p, base, 0, (quant + stride - 1) / stride, stride, sm);
  trace_stamp(p, 5);
  __syncthreads();
  const float inv = p.rotate_out ? rsqrtf(static_cast<float>(D)) : 1.f;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  for (int r0 = 0; r0 < rows; r0 += kSlots) {  // uniform trip count: every lane of a row takes part in the shuffles
    const int r = r0 + slot;
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, big = win.m, l = 0.f;
    if (r < rows) {
      if (r0 > 0) win = load_window_part<D>(p, base, rows, r, chunk);
      big = sum_parts<D, NT>(sm, parts, rows, r, chunk, win.m, l, x);
    }
    if (p.rotate_out) fwht_lanes<D>(x);
    if (r < rows && !dry) {
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

// The (row, x) a CTA works on, x as blockIdx.x would be in the plain row-by-row order (0: the window's own CTA with
// window_cta; gridDim.x - 1 without it: the last split, carrying the folded window). The block scheduler starts CTAs in
// linear order (blockIdx.y * gridDim.x + blockIdx.x), so p.order decides which work starts first: order 1 starts
// every row's special CTA first (the longest when the window is folded; measured slower), order 2 last (the
// window's own CTAs of a several-wave plan, short, filling the last wave's gaps: quant/kernels/cuda/plan.py cta_order).
struct CtaWork {
  int64_t row;
  int x;
};

__device__ __forceinline__ CtaWork cta_work(const DecodeParams& p) {
  const int n = static_cast<int>(gridDim.x);
  if (p.order == 0 || n < 2) return {static_cast<int64_t>(blockIdx.y), static_cast<int>(blockIdx.x)};
  const int64_t rows = gridDim.y, lin = static_cast<int64_t>(blockIdx.y) * n + blockIdx.x;
  const int special = p.window_cta ? 0 : n - 1;
  const int64_t first_other = p.order == 1 ? rows : 0, first_special = p.order == 1 ? 0 : rows * (n - 1);
  if (lin >= first_special && lin < first_special + rows) return {lin - first_special, special};
  const int64_t j = lin - first_other;
  const int xi = static_cast<int>(j % (n - 1));
  return {j / (n - 1), p.window_cta ? xi + 1 : xi};
}

// Grid (num_splits + 1, B * Hkv) with window_cta: CTA 0 attends to the full-precision window (its partial is
// slot num_splits), CTA x > 0 to quantized split x - 1. Else grid (max(num_splits, 1), B * Hkv): CTA x attends
// to split x and the last one also to the window first. The last CTA to finish merges all partials
// (threadFenceReduction pattern). (Letting the window CTA, idle after its window, merge the splits as their flags
// came up instead was slower: its polling slowed the split beside it on its SM.)
template <int D, int NT, typename T, bool kGroups>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D, NT>& sm = *reinterpret_cast<DecodeSmem<D, NT>*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  // Window first in its own CTA (its code runs once per step, from a cold instruction cache, in parallel with the
  // splits) or folded into the last split's CTA (batched steps, where a slot per row is too dear).
  const CtaWork cw = cta_work(p);
  const int64_t bh = cw.row;
  const bool window = p.window_cta ? cw.x == 0 : cw.x == static_cast<int>(gridDim.x) - 1;
  const int split = p.window_cta ? cw.x - 1 : cw.x;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  int arrivals = 0;
  WarpState<D, NT> w;
  trace_stamp(p, 0);
  if (window) {
    init_state<D, NT>(w);
    residual_part<D, NT, T>(p, b, h, w, sm.res[warp]);
    finish_state<D, NT>(w);
    write_partial<D, NT, T>(p, bh, p.num_splits, w, sm, false);
    ++arrivals;
  }
  if (split >= 0 && split < p.num_splits) {
    if (window) __syncthreads();  // the window's write_partial read sm.acc, which the stages alias
    quantized_part<D, NT, T>(p, b, bh, split, w, sm);
    finish_state<D, NT>(w);
    trace_stamp(p, 2);
    write_partial<D, NT, T>(p, bh, split, w, sm, false);
    ++arrivals;
  }
  // The barrier orders every thread's partial before thread 0's arrival, an acq_rel atomic: it releases them to the
  // last CTA and, in that one, acquires the other CTAs' (the pattern of CUTLASS's GenericBarrier; cheaper than a
  // sequentially consistent fence in every thread). A two-level merge (merge_group
  // > 0, the window in its own CTA): a quantized split arrives at its group's counter; the group's last CTA merges the
  // group (combine_group) and arrives, for the group, at the row's counter, where the window's CTA arrives too.
  const int groups = kGroups ? merge_groups(p) : 0;
  const bool grouped = groups > 0 && !window;
  const int g = grouped ? split / p.merge_group : 0;
  const int g_count = grouped ? min(p.merge_group, p.num_splits - g * p.merge_group) : 0;
  int32_t* g_counter = p.counters + gridDim.y + bh * groups + g;
  const int expected = groups > 0 ? groups + 1 : p.num_splits + 1;
  __syncthreads();
  if (threadIdx.x == 0)
    sm.last = grouped ? atomic_add_acq_rel(g_counter, 1) + 1 == g_count
                      : atomic_add_acq_rel(p.counters + bh, arrivals) + arrivals == expected;
  __syncthreads();
  trace_stamp(p, 3);
#if OSCAR_WARM_MERGE
  // Row 0's window CTA, done long before the splits, runs the merge's code (the same call site, so the same code)
  // once without storing anything, so that the merging CTA fetches that code from L2 rather than DRAM: a read-only
  // flush (or a step's weight GEMMs) leaves no kernel code in L2, and a merge's code from DRAM slows it. Rows of 4
  // query rows (Qwen3) are left out: there it cost time after the dirty flush and gained nothing (docs/PERFORMANCE.md,
  // "Design choices in the kernel code").
  const bool dry = !sm.last && p.window_cta && window && bh == 0 && p.group * p.lq >= OSCAR_WARM_MERGE_ROWS;
#else
  constexpr bool dry = false;
#endif
  if (!sm.last && !dry) return;
  if (kGroups && grouped) {  // (never the window's CTA, so never dry)
    combine_group<D, NT>(p, bh, g * p.merge_group, g_count, sm);
    __syncthreads();
    if (threadIdx.x == 0) {
      *g_counter = 0;  // ready for the next call
      sm.last = atomic_add_acq_rel(p.counters + bh, 1) + 1 == expected;
    }
    __syncthreads();
    trace_stamp(p, 6);
    if (!sm.last) return;
  }
  combine_splits<D, NT, T, kGroups>(p, bh, sm, dry);
  if (dry) return;
  if (threadIdx.x == 0) p.counters[bh] = 0;  // ready for the next call
  trace_stamp(p, 4);
}

// A row of one CTA (one split, the window folded, V's rotation in the weights: the batched plans of short rows, the
// thinker's 64 x 4K): the split's groups, then the window in the same online-softmax state (one basis), then the row's
// normalized output, with no partial, no counter and no merge. Window last: every CTA's stream starts at once, where
// decode_split_kernel's folded window comes first, a phase in which all CTAs read windows only. A kernel of its own:
// the same change inside decode_split_kernel slowed the plans of several CTAs a row (docs/PERFORMANCE.md, "Design
// choices in the kernel code").
template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_row_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D, NT>& sm = *reinterpret_cast<DecodeSmem<D, NT>*>(smem_raw);
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  WarpState<D, NT> w;
  trace_stamp(p, 0);
  quantized_part<D, NT, T>(p, b, bh, 0, w, sm);
  trace_stamp(p, 2);
  __syncthreads();  // a warp's window tiles alias other warps' stages
  residual_part<D, NT, T>(p, b, h, w, sm.res[threadIdx.x >> 5]);
  finish_state<D, NT>(w);
  write_partial<D, NT, T>(p, bh, 0, w, sm, true);
  trace_stamp(p, 3);
}

#ifndef OSCAR_ROW_KERNEL_TOKENS
#define OSCAR_ROW_KERNEL_TOKENS 24576  // quant/kernels/cuda/loader.py ROW_KERNEL_TOKENS passes its value
#endif

// Rows of one CTA up to OSCAR_ROW_KERNEL_TOKENS packed tokens go to decode_row_kernel. Its group loop compiles to ~5%
// more instructions than decode_split_kernel's (address arithmetic rematerialized), a cost that grows with the row,
// against a fixed saving (the window phase and the merge); the limit is where they cross (docs/PERFORMANCE.md,
// "Design choices in the kernel code").
__host__ __device__ __forceinline__ bool row_kernel(const DecodeParams& p) {
  return !p.window_cta && p.num_splits == 1 && !p.rotate_out && p.tokens <= OSCAR_ROW_KERNEL_TOKENS;
}

// Devices on which a specialization's shared-memory limit is raised. Internal linkage on purpose, by `static`: a
// template's variable (or a function-local static of an inline template) is one symbol across every loaded module
// (STB_GNU_UNIQUE), and nvcc gives an anonymous namespace's templates that linkage too. So a second build of the same
// kernels in one process skipped its own setup: the WIDE build's 131 KB of shared memory after the narrow build's
// launches failed with "invalid argument" (tests/kernels/test_csrc.py checks the object for such symbols).
template <int D, int NT, typename T, int kKind>
static bool decode_configured[64] = {};

// kKind 0: decode_split_kernel; 1: the same with a two-level merge; 2: decode_row_kernel.
template <int D, int NT, typename T, int kKind>
cudaError_t launch_decode_kernel(const DecodeParams& p, int batch, cudaStream_t stream) {
  void (*kernel)(DecodeParams) = kKind == 2 ? decode_row_kernel<D, NT, T> : decode_split_kernel<D, NT, T, kKind == 1>;
  const size_t smem = sizeof(DecodeSmem<D, NT>);
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !decode_configured<D, NT, T, kKind>[dev]) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) decode_configured<D, NT, T, kKind>[dev] = true;
  }
  const int ctas = p.window_cta ? p.num_splits + 1 : max(p.num_splits, 1);
  kernel<<<dim3(ctas, batch * p.kv_heads), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int D, int NT, typename T>
cudaError_t launch_decode_nt(const DecodeParams& p, int batch, cudaStream_t stream) {
  if (row_kernel(p)) return launch_decode_kernel<D, NT, T, 2>(p, batch, stream);
  return grouped_launch(p) ? launch_decode_kernel<D, NT, T, 1>(p, batch, stream)
                           : launch_decode_kernel<D, NT, T, 0>(p, batch, stream);
}

// Host: one launch (splits, the window folded into the last split's CTA, the merge in the last CTA to
// finish). batch = B. Returns the first CUDA error.
template <int D, typename T>
cudaError_t launch_decode(const DecodeParams& p, int batch, cudaStream_t stream) {
  const int rows = p.group * p.lq;
  if (rows > 16 || p.num_splits + 1 > kMaxSplits) return cudaErrorInvalidValue;
  if constexpr (kWarps > 8) {  // one head tile only: two take ~250 registers a thread, past 65536 / kThreads
    return rows <= 8 ? launch_decode_nt<D, 1, T>(p, batch, stream) : cudaErrorInvalidValue;
  } else {
    return rows <= 8 ? launch_decode_nt<D, 1, T>(p, batch, stream) : launch_decode_nt<D, 2, T>(p, batch, stream);
  }
}

}  // namespace oscar
