// The decode kernel's body, the split merge done by the last CTA of each (b, kv head), and the host launcher.
#pragma once
#include <cuda_runtime.h>

namespace oscar {

// Last CTA of (b, kv head): M = max_s m_s, w_s = 2^(m_s - M), L = sum_s w_s l_s; O_q = sum over quantized
// splits of w_s o_s (rotated basis), O_r = w_res o_res; out = (fwht(O_q) / sqrt(D) + O_r) / L. Threads take
// (row, 4 channels) and, when there are few rows, a share of the splits (parts), summed in shared memory.
template <int D, int NT, typename T>
__device__ void combine_splits(const DecodeParams& p, int64_t bh, DecodeSmem<D, NT>& sm) {
  const int rows = p.group * p.lq, splits = p.num_splits + 1;
  const int64_t base = bh * splits;
  const float* ml = p.part_ml;
  float* oq = &sm.acc[0][0][0];          // [rows][D]: the quantized sum (then rotated back)
  float* part = &sm.acc[1][0][0];        // [parts][rows][D] partial sums
  float* stat = &sm.m[0][0];             // [rows]: M, then [kRows + r]: L
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
  const int items = rows * (D / 4);
  const int parts = max(1, min(kThreads / items, 8));
  const int item = threadIdx.x % items, part_id = threadIdx.x / items;
  for (int it = item; it < items && part_id < parts; it += kThreads) {
    const int r = it / (D / 4), d4 = it % (D / 4);
    const float m = stat[r];
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16  // independent loads in flight: this loop is on the critical path of a batch-1 step
    for (int s = part_id; s < splits - 1; s += parts) {
      const float a = exp2f(__ldcg(ml + (base + s) * 2 * rows + r) - m);
      const float4 x = __ldcg(reinterpret_cast<const float4*>(p.part_o + ((base + s) * rows + r) * D) + d4);
      o.x += a * x.x, o.y += a * x.y, o.z += a * x.z, o.w += a * x.w;
    }
    reinterpret_cast<float4*>(part + (part_id * rows + r) * D)[d4] = o;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    float sum = 0.f;
    for (int k = 0; k < parts; ++k) sum += part[k * rows * D + idx];
    oq[idx] = sum;
  }
  if (p.rotate) fwht_rows<D>(oq, rows, D);  // starts and ends with a barrier
  else __syncthreads();
  const float inv = p.rotate ? rsqrtf(static_cast<float>(D)) : 1.f;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const float w_res = exp2f(__ldcg(ml + (base + splits - 1) * 2 * rows + r) - stat[r]);
    const float o_r = w_res * __ldcg(p.part_o + ((base + splits - 1) * rows + r) * D + d);
    const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
    static_cast<T*>(p.out)[(head * p.lq + r / p.group) * D + d] =
        from_float<T>((oq[idx] * inv + o_r) / stat[DecodeSmem<D, NT>::kRows + r]);
  }
}

// Grid (max(num_splits, 1), B * Hkv): CTA x attends to quantized split x; the last CTA of each (b, h) also
// attends to the full-precision window first (its own partial, slot num_splits), so no CTA sits on a slot
// with little work. The last CTA to finish merges all partials (threadFenceReduction pattern).
template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D, NT>& sm = *reinterpret_cast<DecodeSmem<D, NT>*>(smem_raw);
  const int split = blockIdx.x, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  int arrivals = 0;
  uint32_t qf[D / 16][NT][2];
  WarpState<D, NT> w;
  if (split == gridDim.x - 1) {
    query_fragments<D, NT, T>(p, b, h, false, sm.q, qf);
    init_state<D, NT>(w);
    residual_part<D, NT, T>(p, b, h, qf, w, sm.res[warp].k, sm.res[warp].vt);
    finish_state<D, NT>(w);
    write_partial<D, NT>(p, bh, p.num_splits, w, sm);
    ++arrivals;
  }
  if (split < p.num_splits) {
    query_fragments<D, NT, T>(p, b, h, p.rotate, sm.q, qf);  // its barriers also end write_partial's reads
    init_state<D, NT>(w);
    quantized_part<D, NT>(p, b, bh, split, qf, w, sm.stage[warp]);
    finish_state<D, NT>(w);
    write_partial<D, NT>(p, bh, split, w, sm);
    ++arrivals;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sm.last = atomicAdd(p.counters + bh, arrivals) + arrivals == p.num_splits + 1;
  __syncthreads();
  if (!sm.last) return;
  __threadfence();
  combine_splits<D, NT, T>(p, bh, sm);
  if (threadIdx.x == 0) p.counters[bh] = 0;  // ready for the next call
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
  decode_split_kernel<D, NT, T><<<dim3(max(p.num_splits, 1), batch * p.kv_heads), kThreads, smem, stream>>>(p);
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
