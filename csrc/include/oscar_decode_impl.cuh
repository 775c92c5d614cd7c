// Kernels and host launchers of oscar_decode.cuh (split out to keep each file short).
#pragma once
#include <cuda_runtime.h>

namespace oscar {

template <typename T>
__device__ __forceinline__ uint32_t h2_from(const T* a, const T* b, bool ok) {
  return ok ? pack_half2(to_float(*a), to_float(*b)) : 0u;
}

// (v[t][ch], v[t + 1][ch]) as half2; rows at or past res_len read as 0 (their p is 0, and 0 * garbage
// could be NaN).
template <typename T>
__device__ __forceinline__ uint32_t value_pair(const T* v, int64_t stride, int t, int res_len) {
  const float a = t < res_len ? to_float(v[0]) : 0.f;
  const float b = t + 1 < res_len ? to_float(v[stride]) : 0.f;
  return pack_half2(a, b);
}

// Residual window (full precision, not rotated): warp w takes 32-token chunks w, w + 4, ...
template <int D, typename T>
__device__ void residual_part(const DecodeParams& p, int b, int h, const uint4 (*qa)[32], Frag<D>& f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int res_len = p.res_lens[b];
  const T* kr = static_cast<const T*>(p.k_res) + b * p.kr_sb + h * p.kr_sh;
  const T* vr = static_cast<const T*>(p.v_res) + b * p.vr_sb + h * p.vr_sh;
  // Row r is query token r / group; token a of Lq sees positions < res_len - lq + 1 + a.
  const int rows = p.group * p.lq;
  const int lim0 = g < rows ? res_len - p.lq + 1 + g / p.group : 0;
  const int lim1 = g + 8 < rows ? res_len - p.lq + 1 + (g + 8) / p.group : 0;
  for (int t0 = kGroup * warp; t0 < res_len; t0 += kGroup * kWarps) {
    float sc[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int ch = 16 * ks + 2 * c;
      const uint4 a4 = qa[ks][lane];
      const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int t = t0 + 8 * j + g;
        const T* row = kr + static_cast<int64_t>(t) * p.kr_st;
        mma16816(sc[j], a, h2_from(row + ch, row + ch + 1, t < res_len),
                 h2_from(row + ch + 8, row + ch + 9, t < res_len));
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t0 + 8 * j + 2 * c + (e & 1);
        sc[j][e] = t < (e < 2 ? lim0 : lim1) ? sc[j][e] * p.scale_log2 : -INFINITY;
      }
    uint32_t pa[2][4];
    softmax_step<D>(sc, f, pa);
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) {
      const int ta = t0 + 16 * kt + 2 * c;
      const T* va = vr + static_cast<int64_t>(ta) * p.vr_st;
      const T* vb = vr + static_cast<int64_t>(ta + 8) * p.vr_st;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int ch = 8 * n + g;
        mma16816(f.acc[n], pa[kt], value_pair(va + ch, p.vr_st, ta, res_len),
                 value_pair(vb + ch, p.vr_st, ta + 8, res_len));
      }
    }
  }
}

template <int D>
__device__ void quantized_part(const DecodeParams& p, int b, int64_t bh, int split, const uint4 (*qa)[32],
                               Frag<D>& f, WarpStage<D>& st) {
  const int warp = threadIdx.x >> 5;
  const int kv_len = p.kv_lens[b];
  const int start = split * p.split_tokens;
  const int end = min(start + p.split_tokens, kv_len);
  const int g_end = (end + kGroup - 1) / kGroup;
  int gi = start / kGroup + warp;
  if (gi >= g_end) return;
  GroupRegs<D> regs;
  load_group<D>(regs, p, bh, b, gi);
  for (; gi < g_end; gi += kWarps) {
    __syncwarp();
    store_group<D>(regs, st, kv_len - kGroup * gi);
    __syncwarp();
    if (gi + kWarps < g_end) load_group<D>(regs, p, bh, b, gi + kWarps);  // in flight during the math
    float sc[4][4];
    group_scores<D>(st, qa, kv_len - kGroup * gi, p.scale_log2, sc);
    uint32_t pa[2][4];
    softmax_step<D>(sc, f, pa);
    group_pv<D>(st, pa, f);
  }
}

// Load the query rows into shared memory (rotated by the Hadamard for quantized CTAs).
template <int D, typename T>
__device__ void stage_query(const DecodeParams& p, int b, int h, bool rotate, float (*q)[D]) {
  const int rows = p.group * p.lq;
  const T* qp = static_cast<const T*>(p.q);
  for (int idx = threadIdx.x; idx < 16 * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    float x = 0.f;
    if (r < rows) {
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      x = to_float(qp[(head * p.lq + r / p.group) * D + d]);
    }
    q[r][d] = x;
  }
  if (rotate) {
    fwht_rows<D>(&q[0][0], 16, D);  // ends with __syncthreads
    const float inv = rsqrtf(static_cast<float>(D));
    for (int idx = threadIdx.x; idx < 16 * D; idx += blockDim.x) q[idx / D][idx % D] *= inv;
  }
  __syncthreads();
}

// Merge the 4 warps' states and write this split's partial (valid rows only).
template <int D>
__device__ void write_partial(const DecodeParams& p, int64_t bh, int split, Frag<D>& f, DecodeSmem<D>& sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const float l0 = quad_sum(f.l[0]), l1 = quad_sum(f.l[1]);
  __syncthreads();  // acc aliases the staging buffers other warps may still be reading
  if (c == 0) {
    sm.m[warp][g] = f.m[0], sm.m[warp][g + 8] = f.m[1];
    sm.l[warp][g] = l0, sm.l[warp][g + 8] = l1;
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    sm.acc[warp][g][8 * n + 2 * c] = f.acc[n][0];
    sm.acc[warp][g][8 * n + 2 * c + 1] = f.acc[n][1];
    sm.acc[warp][g + 8][8 * n + 2 * c] = f.acc[n][2];
    sm.acc[warp][g + 8][8 * n + 2 * c + 1] = f.acc[n][3];
  }
  __syncthreads();
  const int rows = p.group * p.lq;
  const int64_t slot = bh * (p.num_splits + 1) + split;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    float m = sm.m[0][r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, sm.m[w][r]);
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float a = exp2f(sm.m[w][r] - m);
      l += a * sm.l[w][r];
      o += a * sm.acc[w][r][d];
    }
    p.part_o[(slot * rows + r) * D + d] = o;
    if (d == 0) {
      p.part_ml[(slot * 2) * rows + r] = m;
      p.part_ml[(slot * 2 + 1) * rows + r] = l;
    }
  }
}

constexpr float kNegInit = -1.0e30f;  // finite: fully masked tiles give exp2(-inf) = 0, never NaN

#ifndef OSCAR_MIN_BLOCKS
#define OSCAR_MIN_BLOCKS 2  // CTAs per SM the register budget must allow (a build-time specialization)
#endif

template <int D, typename T>
__global__ void __launch_bounds__(kThreads, OSCAR_MIN_BLOCKS) decode_split_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  DecodeSmem<D>& sm = *reinterpret_cast<DecodeSmem<D>*>(smem_raw);
  const int split = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
  const bool residual = split == p.num_splits;
  stage_query<D, T>(p, b, h, p.rotate && !residual, sm.work.q);
  query_frags<D>(sm.work.q, sm.qa);
  __syncthreads();
  Frag<D> f;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) f.acc[n][0] = f.acc[n][1] = f.acc[n][2] = f.acc[n][3] = 0.f;
  f.m[0] = f.m[1] = kNegInit;
  f.l[0] = f.l[1] = 0.f;
  if (residual) residual_part<D, T>(p, b, h, sm.qa, f);
  else quantized_part<D>(p, b, bh, split, sm.qa, f, sm.work.stage[threadIdx.x >> 5]);
  write_partial<D>(p, bh, split, f, sm);
}

}  // namespace oscar

#include "oscar_combine.cuh"
