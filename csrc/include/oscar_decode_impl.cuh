// The decode kernel of oscar_decode.cuh: per-warp cp.async pipeline over the quantized groups, the
// full-precision window, the warps' merge into one partial per split (then oscar_combine.cuh).
#pragma once
#include <cuda_runtime.h>

namespace oscar {

template <int D, int NT>
struct DecodeSmem {
  static constexpr int kRows = 8 * NT;
  union {
    unsigned char stage[kWarps][kStages][Stage<D>::kBytes];  // quantized CTAs: each warp's pipeline
    struct {  // the window CTA: 16 tokens per warp step, keys as rows and values transposed (fp16)
      __half k[16][D + 8];
      __half vt[D][16 + 8];
    } res[kWarps];
    float acc[kWarps][kRows][D];  // the warps' final O, merged into the split's partial
  };
  float q[kRows][D];  // query rows (rotated for quantized CTAs) before they become B fragments
  float m[kWarps][kRows], l[kWarps][kRows];
  int last;  // this CTA merges the splits (oscar_combine.cuh)
};

// Per-lane sources of one group's 16-byte chunks (oscar_decode.cuh Stage): codes in D/64 rounds, scales and
// zeros (keys, values) and norms in one round each; `gi` selects the group.
template <int D>
struct GroupSource {
  const unsigned char *kc, *ksz, *vc, *vsz, *norm;
  __device__ __forceinline__ GroupSource(const DecodeParams& p, int64_t bh, int b) {
    const int lane = threadIdx.x & 31;
    constexpr int kSZ = D / 8;  // chunks of one scale row (keys) / one block's value scales
    const int64_t t = p.tokens;
    kc = reinterpret_cast<const unsigned char*>(p.kc + bh * (t / 16) * D) + 16 * lane;
    const __half* ks = lane < kSZ ? p.ks : p.kz;
    ksz = reinterpret_cast<const unsigned char*>(ks + bh * (t / 32) * D) + 16 * (lane % kSZ);
    vc = reinterpret_cast<const unsigned char*>(p.vc + bh * t * (D / 16)) + 16 * lane;
    const __half* vs = lane < kSZ ? p.vs : p.vz;
    vsz = reinterpret_cast<const unsigned char*>(vs + bh * t * (D / 32)) + 16 * (lane % kSZ);
    norm = reinterpret_cast<const unsigned char*>(p.norms + static_cast<int64_t>(b) * t) + 16 * lane;
  }
  __device__ __forceinline__ void issue(unsigned char* st, int gi) const {
    using L = Stage<D>;
    const int lane = threadIdx.x & 31;
    const uint32_t dst = smem_addr(st) + 16 * lane;
    const int64_t code_off = static_cast<int64_t>(gi) * 8 * D, sz_off = static_cast<int64_t>(gi) * 2 * D;
#pragma unroll
    for (int j = 0; j < D / 64; ++j) cp_async16(dst + L::kKC + 512 * j, kc + code_off + 512 * j);
    if (lane < D / 4) cp_async16(dst + L::kKS, ksz + sz_off);
#pragma unroll
    for (int j = 0; j < D / 64; ++j) cp_async16(dst + L::kVC + 512 * j, vc + code_off + 512 * j);
    if (lane < D / 4) cp_async16(dst + L::kVS, vsz + sz_off);
    if (lane < 8) cp_async16(dst + L::kNorm, norm + static_cast<int64_t>(gi) * 128);
  }
};

template <int D, int NT>
__device__ void quantized_part(const DecodeParams& p, int b, int64_t bh, int split, const uint32_t (&qf)[D / 16][NT][2],
                               WarpState<D, NT>& w, unsigned char (*stages)[Stage<D>::kBytes]) {
  const int warp = threadIdx.x >> 5;
  const int kv_len = p.kv_lens[b];
  const int start = split * p.split_tokens;
  const int end = min(start + p.split_tokens, kv_len);
  const int first = start / kGroup + warp;
  const int n = end > start ? ((end + kGroup - 1) / kGroup - first + kWarps - 1) / kWarps : 0;
  if (n <= 0) return;
  const GroupSource<D> src(p, bh, b);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) src.issue(stages[s], first + kWarps * s);
    cp_async_commit();
  }
  for (int k = 0; k < n; ++k) {
    const int pre = k + kStages - 1;
    if (pre < n) src.issue(stages[pre % kStages], first + kWarps * pre);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int gi = first + kWarps * k;
    group_step<D, NT>(stages[k % kStages], qf, w, kv_len - kGroup * gi, p.scale_log2);
    __syncwarp();  // the stage is refilled next iteration
  }
}

// 8 elements (16 bytes) as 4 fp16 pairs.
template <typename T>
__device__ __forceinline__ uint4 to_half8(uint4 x);
template <>
__device__ __forceinline__ uint4 to_half8<__half>(uint4 x) { return x; }
template <>
__device__ __forceinline__ uint4 to_half8<__nv_bfloat16>(uint4 x) {
  uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = as_u32(__float22half2_rn(__bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]))));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Full-precision window (not rotated): warp w takes 16-token steps w, w + 4, ... Keys staged as rows, values
// transposed, both fp16 (rows past res_len are 0): a step's 16-byte loads of K are all issued before any is
// used, then those of V (the window is on the critical path of a batch-1 step). Causal inside the window for Lq > 1.
template <int D, int NT, typename T>
__device__ void residual_part(const DecodeParams& p, int b, int h, const uint32_t (&qf)[D / 16][NT][2],
                              WarpState<D, NT>& w, __half (*kb)[D + 8], __half (*vt)[16 + 8]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int res_len = p.res_lens[b];
  const T* kr = static_cast<const T*>(p.k_res) + b * p.kr_sb + h * p.kr_sh;
  const T* vr = static_cast<const T*>(p.v_res) + b * p.vr_sb + h * p.vr_sh;
  const int rows = p.group * p.lq;
  int lim[NT][2];  // query row 8 nt + 2c + hc (token a = row / group) sees window positions < lim
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) {
      const int row = 8 * nt + 2 * c + hc;
      lim[nt][hc] = row < rows ? res_len - p.lq + 1 + row / p.group : 0;
    }
  constexpr int kVecs = 16 * D / 8 / 32;  // 16-byte vectors per lane per step (8 for D = 128)
  for (int t0 = 16 * warp; t0 < res_len; t0 += 16 * kWarps) {
    uint4 x[kVecs];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int idx = lane + 32 * i, t = idx / (D / 8), d = 8 * (idx % (D / 8));
      x[i] = t0 + t < res_len ? __ldg(reinterpret_cast<const uint4*>(kr + static_cast<int64_t>(t0 + t) * p.kr_st + d))
                              : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();  // the previous step's reads of kb / vt are done
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int idx = lane + 32 * i, t = idx / (D / 8), d = 8 * (idx % (D / 8));
      *reinterpret_cast<uint4*>(&kb[t][d]) = to_half8<T>(x[i]);
      x[i] = t0 + t < res_len ? __ldg(reinterpret_cast<const uint4*>(vr + static_cast<int64_t>(t0 + t) * p.vr_st + d))
                              : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int idx = lane + 32 * i, t = idx / (D / 8), d = 8 * (idx % (D / 8));
      const uint4 v8 = to_half8<T>(x[i]);
      const __half* vh = reinterpret_cast<const __half*>(&v8);
#pragma unroll
      for (int j = 0; j < 8; ++j) vt[d + j][t] = vh[j];
    }
    __syncwarp();
    float sc[1][NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        a[r] = *reinterpret_cast<const uint32_t*>(&kb[g + 8 * (r & 1)][frag_channel(ks, 2 * c + 8 * (r >> 1))]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816(sc[0][nt], a, qf[ks][nt][0], qf[ks][nt][1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t0 + g + 8 * (e >> 1);
        sc[0][nt][e] = t < lim[nt][e & 1] ? sc[0][nt][e] * p.scale_log2 : -INFINITY;
      }
    uint32_t pb[1][NT][2];
    softmax_to_p<D, NT, 1>(sc, w, pb);
#pragma unroll
    for (int mv = 0; mv < D / 16; ++mv) {
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        a[r] = *reinterpret_cast<const uint32_t*>(&vt[16 * mv + g + 8 * (r & 1)][2 * c + 8 * (r >> 1)]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816(w.acc[mv][nt], a, pb[0][nt][0], pb[0][nt][1]);
    }
  }
}

// Query rows -> rotated by the normalized Hadamard for quantized CTAs (in registers: each thread loads 8
// channels of a row with one 16-byte load, fwht_lanes) -> shared -> fp16 B fragments in the frag channel order
// (B = Q^T: k = channels frag_channel(ks, .), n = row 8 nt + g). One barrier.
template <int D, int NT, typename T>
__device__ void query_fragments(const DecodeParams& p, int b, int h, bool rotate, float (*q)[D],
                                uint32_t (&qf)[D / 16][NT][2]) {
  constexpr int kPerRow = D / 8, kRowsPerPass = kThreads / kPerRow;
  const int rows = p.group * p.lq;
  const T* qp = static_cast<const T*>(p.q);
  const int d0 = 8 * (threadIdx.x % kPerRow);
#pragma unroll
  for (int r0 = 0; r0 < 8 * NT; r0 += kRowsPerPass) {
    const int r = r0 + threadIdx.x / kPerRow;
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (r < rows) {
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(qp + (head * p.lq + r / p.group) * D + d0));
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
    }
    if (rotate) fwht_lanes<D>(x);  // rows are whole lane groups, so every lane takes part
    const float inv = rotate ? rsqrtf(static_cast<float>(D)) : 1.f;
    if (r < 8 * NT) {  // (D = 64: one pass covers 16 rows)
      float4* dst = reinterpret_cast<float4*>(&q[r][d0]);
      dst[0] = make_float4(x[0] * inv, x[1] * inv, x[2] * inv, x[3] * inv);
      dst[1] = make_float4(x[4] * inv, x[5] * inv, x[6] * inv, x[7] * inv);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = frag_channel(ks, 2 * c + 8 * e);
        qf[ks][nt][e] = pack_half2(q[8 * nt + g][d], q[8 * nt + g][d + 1]);
      }
}

// Merge the 4 warps' states and write this split's partial (valid rows only).
template <int D, int NT>
__device__ void write_partial(const DecodeParams& p, int64_t bh, int split, WarpState<D, NT>& w, DecodeSmem<D, NT>& sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  __syncthreads();  // acc aliases the stages other warps may still be reading
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 8 * nt + 2 * c + (e & 1);
#pragma unroll
      for (int mv = 0; mv < D / 16; ++mv) sm.acc[warp][row][16 * mv + g + 8 * (e >> 1)] = w.acc[mv][nt][e];
      if (g == 0 && e < 2) sm.m[warp][row] = w.m[nt][e], sm.l[warp][row] = w.l[nt][e];
    }
  __syncthreads();
  const int rows = p.group * p.lq;
  const int64_t slot = bh * (p.num_splits + 1) + split;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    float m = sm.m[0][r];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) m = fmaxf(m, sm.m[k][r]);
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      const float a = exp2f(sm.m[k][r] - m);
      l += a * sm.l[k][r];
      o += a * sm.acc[k][r][d];
    }
    p.part_o[(slot * rows + r) * D + d] = o;
    if (d == 0) {
      p.part_ml[(slot * 2) * rows + r] = m;
      p.part_ml[(slot * 2 + 1) * rows + r] = l;
    }
  }
}

#ifndef OSCAR_MIN_BLOCKS
#define OSCAR_MIN_BLOCKS 3  // CTAs per SM the register budget must allow with one head tile (a specialization)
#endif

template <int NT>
struct MinBlocks {
  static constexpr int value = NT == 1 ? OSCAR_MIN_BLOCKS : 2;
};

template <int D, int NT, typename T>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p);

}  // namespace oscar

#include "oscar_combine.cuh"
