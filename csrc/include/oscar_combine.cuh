// Split-KV combine and the host launcher of the decode attention (see oscar_decode.cuh).
#pragma once
#include <cuda_runtime.h>

namespace oscar {

constexpr int kCombineParts = 4;  // thread groups of D that each sum a quarter of the splits

__device__ __forceinline__ float warp_reduce(float x, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  return x;
}

// One CTA per (b, kv head, row), kCombineParts * D threads: M = max_s m_s, w_s = 2^(m_s - M),
// L = sum_s w_s l_s; O_q = sum over quantized splits of w_s o_s (rotated basis), O_r = w_res o_res;
// out = (fwht(O_q) / sqrt(D) + O_r) / L. The splits are summed by 4 thread groups with independent
// loads in flight (the sum is latency-bound: a few MB in all, but long dependent chains if serial).
template <int D, typename T>
__global__ void __launch_bounds__(kCombineParts * D) combine_kernel(const DecodeParams p) {
  __shared__ float part[kCombineParts][D];
  __shared__ float stat[2];
  const int64_t bh = blockIdx.x;
  const int r = blockIdx.y, rows = p.group * p.lq, splits = p.num_splits + 1;
  const int64_t base = bh * splits;
  const float* ml = p.part_ml;
  if (threadIdx.x < 32) {  // warp 0: the row's max and normalizer over all splits
    float m = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) m = fmaxf(m, ml[(base + s) * 2 * rows + r]);
    m = warp_reduce(m, true);
    float l = 0.f;
    for (int s = threadIdx.x; s < splits; s += 32)
      l += exp2f(ml[(base + s) * 2 * rows + r] - m) * ml[((base + s) * 2 + 1) * rows + r];
    l = warp_reduce(l, false);
    if (threadIdx.x == 0) stat[0] = m, stat[1] = l;
  }
  __syncthreads();
  const float m = stat[0];
  const int d = threadIdx.x % D, part_id = threadIdx.x / D;
  float o = 0.f;
#pragma unroll 4
  for (int s = part_id; s < splits - 1; s += kCombineParts)
    o += exp2f(ml[(base + s) * 2 * rows + r] - m) * p.part_o[((base + s) * rows + r) * D + d];
  part[part_id][d] = o;
  __syncthreads();
  __shared__ float oq[1][D];
  if (threadIdx.x < D) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kCombineParts; ++k) sum += part[k][d];
    oq[0][d] = sum;
  }
  if (p.rotate) fwht_rows<D>(&oq[0][0], 1, D);  // starts and ends with a barrier
  __syncthreads();
  if (threadIdx.x < D) {
    const float w_res = exp2f(ml[(base + splits - 1) * 2 * rows + r] - m);
    const float o_r = w_res * p.part_o[((base + splits - 1) * rows + r) * D + d];
    const float inv = p.rotate ? rsqrtf(static_cast<float>(D)) : 1.f;
    const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
    const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
    static_cast<T*>(p.out)[(head * p.lq + r / p.group) * D + d] = from_float<T>((oq[0][d] * inv + o_r) / stat[1]);
  }
}

// Host: launch the split kernel and the combine on `stream`. batch = B. Returns the first CUDA error.
template <int D, typename T>
cudaError_t launch_decode(const DecodeParams& p, int batch, cudaStream_t stream) {
  if (p.group * p.lq > 16) return cudaErrorInvalidValue;  // rows of one tile (checked by the binding)
  if (p.num_splits + 1 > kMaxSplits) return cudaErrorInvalidValue;
  const size_t smem = sizeof(DecodeSmem<D>);
  static bool configured = false;  // per specialization
  if (!configured) {
    const cudaError_t e = cudaFuncSetAttribute(decode_split_kernel<D, T>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured = true;
  }
  const dim3 grid(p.num_splits + 1, batch * p.kv_heads);
  decode_split_kernel<D, T><<<grid, kThreads, smem, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  combine_kernel<D, T><<<dim3(batch * p.kv_heads, p.group * p.lq), kCombineParts * D, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oscar
