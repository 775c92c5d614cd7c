// The decode kernel's body, the split merge done by the last CTA of each (b, kv head), and the host launcher.
#pragma once
#include <cuda_runtime.h>

namespace oscar {

// Last CTA of (b, kv head): M = max_s m_s, w_s = 2^(m_s - M), L = sum_s w_s l_s; O_q = sum over quantized
// splits of w_s o_s (rotated basis), O_r = w_res o_res; out = (fwht(O_q) / sqrt(D) + O_r) / L. A thread takes
// 8 channels of a row (16-byte loads); with few rows, `parts` threads share an item's splits (summed in shared
// memory). The rotation back runs in registers (fwht_lanes) and each thread writes its 8 outputs at once.
template <int D, int NT, typename T>
__device__ void combine_splits(const DecodeParams& p, int64_t bh, DecodeSmem<D, NT>& sm) {
  constexpr int kPerRow = D / 8, kSlots = kThreads / kPerRow;  // threads per row, rows per pass
  const int rows = p.group * p.lq, splits = p.num_splits + 1;
  const int64_t base = bh * splits;
  const float* ml = p.part_ml;
  float* part = &sm.acc[0][0][0];  // [parts][rows][D] partial sums
  float* stat = &sm.m[0][0];       // [rows]: M, then [kRows + r]: L
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < rows; r += kWarps) {
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, __ldcg(ml + (base + s) * 2 * rows + r));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int s = lane; s < splits; s += 32)
      l += exp2f(__ldcg(ml + (base + s) * 2 * rows + r) - m) * __ldcg(ml + ((base + s) * 2 + 1) * rows + r);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) stat[r] = m, stat[DecodeSmem<D, NT>::kRows + r] = l;
  }
  __syncthreads();
  const int parts = rows >= kSlots ? 1 : kSlots / rows, per_pass = kSlots / parts;
  const int chunk = threadIdx.x % kPerRow, slot = threadIdx.x / kPerRow;
  const int part_id = slot / per_pass;
  for (int r = slot % per_pass; r < rows && part_id < parts; r += per_pass) {
    const float m = stat[r];
    float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4  // loads in flight vs code size (the merge runs from a cold instruction cache)
    for (int s = part_id; s < splits - 1; s += parts) {
      const float a = exp2f(__ldcg(ml + (base + s) * 2 * rows + r) - m);
      const float4* src = reinterpret_cast<const float4*>(p.part_o + ((base + s) * rows + r) * D) + 2 * chunk;
      const float4 x0 = __ldcg(src), x1 = __ldcg(src + 1);
      o[0] += a * x0.x, o[1] += a * x0.y, o[2] += a * x0.z, o[3] += a * x0.w;
      o[4] += a * x1.x, o[5] += a * x1.y, o[6] += a * x1.z, o[7] += a * x1.w;
    }
    float4* dst = reinterpret_cast<float4*>(part + (part_id * rows + r) * D) + 2 * chunk;
    dst[0] = make_float4(o[0], o[1], o[2], o[3]);
    dst[1] = make_float4(o[4], o[5], o[6], o[7]);
  }
  __syncthreads();
  const float inv = p.rotate ? rsqrtf(static_cast<float>(D)) : 1.f;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  for (int r0 = 0; r0 < rows; r0 += kSlots) {  // uniform trip count: every lane of a row takes part in the shuffles
    const int r = r0 + slot;
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (r < rows)
#pragma unroll 1
      for (int k = 0; k < parts; ++k) {
        const float4* src = reinterpret_cast<const float4*>(part + (k * rows + r) * D) + 2 * chunk;
        const float4 x0 = src[0], x1 = src[1];
        x[0] += x0.x, x[1] += x0.y, x[2] += x0.z, x[3] += x0.w, x[4] += x1.x, x[5] += x1.y, x[6] += x1.z, x[7] += x1.w;
      }
    if (p.rotate) fwht_lanes<D>(x);
    if (r < rows) {
      const float w_res = exp2f(__ldcg(ml + (base + splits - 1) * 2 * rows + r) - stat[r]);
      const float inv_l = 1.f / stat[DecodeSmem<D, NT>::kRows + r];
      const float4* src = reinterpret_cast<const float4*>(p.part_o + ((base + splits - 1) * rows + r) * D) + 2 * chunk;
      const float4 r0v = __ldcg(src), r1v = __ldcg(src + 1);
      const float o_r[8] = {r0v.x, r0v.y, r0v.z, r0v.w, r1v.x, r1v.y, r1v.z, r1v.w};
      T y[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = from_float<T>((x[i] * inv + w_res * o_r[i]) * inv_l);
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + (head * p.lq + r / p.group) * D + 8 * chunk) =
          *reinterpret_cast<const uint4*>(y);
    }
  }
}

// Grid (num_splits + 1, B * Hkv) with window_cta: CTA 0 attends to the full-precision window (its partial is
// slot num_splits), CTA x > 0 to quantized split x - 1. Else grid (max(num_splits, 1), B * Hkv): CTA x attends
// to split x and the last one also to the window first. The last CTA to finish merges all partials
// (threadFenceReduction pattern).
template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D, NT>& sm = *reinterpret_cast<DecodeSmem<D, NT>*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  // Window first in its own CTA (its code runs once per step, from a cold instruction cache: ~10 us, in parallel
  // with the splits) or folded into the last split's CTA (batched steps, where a slot per row is too dear).
  const bool window = p.window_cta ? blockIdx.x == 0 : blockIdx.x == gridDim.x - 1;
  const int split = p.window_cta ? static_cast<int>(blockIdx.x) - 1 : static_cast<int>(blockIdx.x);
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  int arrivals = 0;
  uint32_t qf[D / 16][NT][2];
  WarpState<D, NT> w;
  trace_stamp(p, 0);
  if (window) {
    query_fragments<D, NT, T>(p, b, h, false, sm.q, qf);
    init_state<D, NT>(w);
    residual_part<D, NT, T>(p, b, h, qf, w, sm.res[warp].k, sm.res[warp].vt);
    finish_state<D, NT>(w);
    write_partial<D, NT>(p, bh, p.num_splits, w, sm);
    ++arrivals;
  }
  if (split >= 0 && split < p.num_splits) {
    query_fragments<D, NT, T>(p, b, h, p.rotate, sm.q, qf);  // its barrier also ends write_partial's reads
    trace_stamp(p, 1);
    init_state<D, NT>(w);
    quantized_part<D, NT>(p, b, bh, split, qf, w, sm.stage[warp]);
    finish_state<D, NT>(w);
    trace_stamp(p, 2);
    write_partial<D, NT>(p, bh, split, w, sm);
    ++arrivals;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sm.last = atomicAdd(p.counters + bh, arrivals) + arrivals == p.num_splits + 1;
  __syncthreads();
  trace_stamp(p, 3);
  if (!sm.last) return;
  __threadfence();
  combine_splits<D, NT, T>(p, bh, sm);
  if (threadIdx.x == 0) p.counters[bh] = 0;  // ready for the next call
  trace_stamp(p, 4);
}

template <int D, int NT, typename T>
cudaError_t launch_decode_nt(const DecodeParams& p, int batch, cudaStream_t stream) {
  const size_t smem = sizeof(DecodeSmem<D, NT>);
  static bool configured = false;  // per specialization
  if (!configured) {
    const cudaError_t e = cudaFuncSetAttribute(decode_split_kernel<D, NT, T>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured = true;
  }
  const int ctas = p.window_cta ? p.num_splits + 1 : max(p.num_splits, 1);
  decode_split_kernel<D, NT, T><<<dim3(ctas, batch * p.kv_heads), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

// Host: one launch (splits, the window folded into the last split's CTA, the merge in the last CTA to
// finish). batch = B. Returns the first CUDA error.
template <int D, typename T>
cudaError_t launch_decode(const DecodeParams& p, int batch, cudaStream_t stream) {
  const int rows = p.group * p.lq;
  if (rows > 16 || p.num_splits + 1 > kMaxSplits) return cudaErrorInvalidValue;
  return rows <= 8 ? launch_decode_nt<D, 1, T>(p, batch, stream) : launch_decode_nt<D, 2, T>(p, batch, stream);
}

}  // namespace oscar
