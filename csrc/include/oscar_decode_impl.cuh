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
    // the window: per warp 32 tokens of K, then of V, rows of D 2-byte elements as stored (window_tile_offset)
    unsigned char res[kWarps][2 * kGroup * 2 * D];
    float acc[kWarps][kRows][D];  // the warps' final O, merged into the split's partial
  };
  float q[kRows][D];  // query rows (rotated for quantized CTAs) before they become B fragments
  float m[kWarps][kRows], l[kWarps][kRows];
  int last;  // this CTA merges the splits (oscar_combine.cuh)
};

// The query: each thread loads 8 channels of a row with one 16-byte load (query_load), then the rows are rotated
// by the normalized Hadamard for quantized CTAs (in registers: fwht_lanes) -> shared -> fp16 B fragments in the frag
// channel order (B = Q^T: k = channels frag_channel(ks, .), n = row 8 nt + g); qk: the same scaled by 2^-p, p the
// mantissa bit of k-step ks's key codes (SlotMap), for the scores (group_step). One barrier.
template <int D, int NT>
struct QueryLoads {
  static constexpr int kPerRow = D / 8, kRowsPerPass = kThreads / kPerRow;
  static constexpr int kPasses = (8 * NT + kRowsPerPass - 1) / kRowsPerPass;
  uint4 v[kPasses];
};

// Issued as volatile asm so that it stays ahead of the cp.async prologue in the SM's request queue: behind a single
// wave's first burst of stages a query load waits for much of it (docs/PERFORMANCE.md, "Design choices in the kernel
// code").
template <int D, int NT, typename T>
__device__ __forceinline__ void query_load(const DecodeParams& p, int b, int h, QueryLoads<D, NT>& ql) {
  using Q = QueryLoads<D, NT>;
  const int rows = p.group * p.lq, d0 = 8 * (threadIdx.x % Q::kPerRow);
  const T* qp = static_cast<const T*>(p.q);
#pragma unroll
  for (int i = 0; i < Q::kPasses; ++i) {
    const int r = i * Q::kRowsPerPass + threadIdx.x / Q::kPerRow;
    ql.v[i] = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) {
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      const T* src = qp + (head * p.lq + r / p.group) * D + d0;
      asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(ql.v[i].x), "=r"(ql.v[i].y), "=r"(ql.v[i].z), "=r"(ql.v[i].w) : "l"(src));
    }
  }
}

template <int D, int NT, typename T>
__device__ void query_fragments(const QueryLoads<D, NT>& ql, bool rotate, float (*q)[D],
                                uint32_t (&qf)[D / 16][NT][2], uint32_t (&qk)[D / 16][NT][2]) {
  using Q = QueryLoads<D, NT>;
  const int d0 = 8 * (threadIdx.x % Q::kPerRow);
#pragma unroll
  for (int i = 0; i < Q::kPasses; ++i) {
    const int r = i * Q::kRowsPerPass + threadIdx.x / Q::kPerRow;
    float x[8];
    const T* e = reinterpret_cast<const T*>(&ql.v[i]);  // zero bits for rows past the query's: 0.0
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = to_float(e[k]);
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
        const float m = 1.f / static_cast<float>(1 << SlotMap<D>::pos(ks));  // a power of 2: exact unless subnormal
        qf[ks][nt][e] = pack_half2(q[8 * nt + g][d], q[8 * nt + g][d + 1]);
        qk[ks][nt][e] = m == 1.f ? qf[ks][nt][e] : pack_half2(m * q[8 * nt + g][d], m * q[8 * nt + g][d + 1]);
      }
}

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
    for (int j = 0; j < D / 64; ++j) copy(dst + L::kKC + 512 * j, kc + code_off + 512 * j);
    if (lane < D / 4) copy(dst + L::kKS, ksz + sz_off);
#pragma unroll
    for (int j = 0; j < D / 64; ++j) copy(dst + L::kVC + 512 * j, vc + code_off + 512 * j);
    if (lane < D / 4) copy(dst + L::kVS, vsz + sz_off);
    if (lane < 8) copy(dst + L::kNorm, norm + static_cast<int64_t>(gi) * 128);
  }
  // The cache is read once per step: marked evict-first in L2, its lines replace each other rather than what else
  // the L2 holds (dirty lines written by earlier kernels, which would otherwise be written back during the step;
  // the partials and the code).
#if OSCAR_EVICT_FIRST
  uint64_t policy = l2_evict_first_policy();
  __device__ __forceinline__ void copy(uint32_t dst, const void* src) const { cp_async16_hint(dst, src, policy); }
#else
  __device__ __forceinline__ void copy(uint32_t dst, const void* src) const { cp_async16(dst, src); }
#endif
};

// CTA `split` owns tokens [split * split_tokens, + split_tokens); its warps take every kWarps-th 32-token group
// through a kStages-deep cp.async pipeline. The query's loads go out first, then the first kStages - 1 groups, so
// the query's rotation and barrier overlap those loads (a CTA's start otherwise has no loads in flight). (A
// schedule where the warps of a row's CTAs claimed groups from a shared counter was slower: docs/PERFORMANCE.md,
// "Design choices in the kernel code".)
template <int D, int NT, typename T>
__device__ void quantized_part(const DecodeParams& p, int b, int64_t bh, int split, WarpState<D, NT>& w,
                               DecodeSmem<D, NT>& sm) {
  const int warp = threadIdx.x >> 5;
  unsigned char (*stages)[Stage<D>::kBytes] = sm.stage[warp];
  const int kv_len = p.kv_lens[b], h = static_cast<int>(bh % p.kv_heads);
  const int start = split * p.split_tokens, end = min(start + p.split_tokens, kv_len);
  const int groups = end > start ? (end + kGroup - 1) / kGroup : 0, first = start / kGroup + warp;
  const GroupSource<D> src(p, bh, b);
  QueryLoads<D, NT> ql;
  query_load<D, NT, T>(p, b, h, ql);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int gi = first + kWarps * s;
    if (gi < groups) src.issue(stages[s], gi);
    cp_async_commit();
  }
  uint32_t qf[D / 16][NT][2], qk[D / 16][NT][2];
  query_fragments<D, NT, T>(ql, p.rotate, sm.q, qf, qk);  // every warp: a barrier
  trace_stamp(p, 1);
  init_state<D, NT>(w);
  for (int k = 0, gi = first; gi < groups; ++k, gi += kWarps) {
    const int next = gi + kWarps * (kStages - 1);
#if OSCAR_SKELETON != 2
    if (next < groups) src.issue(stages[(k + kStages - 1) % kStages], next);
#endif
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
#if OSCAR_SKELETON != 1
    group_step<D, NT>(stages[k % kStages], qf, qk, w, kv_len - kGroup * gi, p.scale_log2);
#endif
    __syncwarp();  // the stage is refilled next iteration
  }
  fold_values<D, NT>(w);
}

// Byte offset of 16-byte chunk `ch` of row `t` in a tile of 32 rows x D 2-byte elements: chunks XOR-swizzled by
// t & 7, so the 8 rows an ldmatrix matrix reads at one logical chunk sit in 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t window_tile_offset(int t, int ch) {
  return static_cast<uint32_t>(t * 2 * D + 16 * (ch ^ (t & 7)));
}

// Full-precision window (not rotated), in its own dtype T: warp w takes the 32-token steps w, w + 4, ... Each step
// is one round of cp.async (K and V rows as stored, rows past res_len zero-filled) into the warp's tiles, then
// A fragments by ldmatrix: K as rows (S^T = K Q^T, k = channels in natural order) and V^T by ldmatrix.trans
// (O^T += V^T P^T). The query enters as natural-order T pairs straight from global memory (no rotation, no shared
// memory, no block barrier), P as T pairs. Causal inside the window for Lq > 1.
template <int D, int NT, typename T>
__device__ void residual_part(const DecodeParams& p, int b, int h, WarpState<D, NT>& w, unsigned char* tile) {
  constexpr int kChunks = D / 8, kTile = kGroup * 2 * D;  // 16-byte chunks per row; bytes of the K (or V) tile
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int res_len = p.res_lens[b];
  int t0 = kGroup * warp;
  if (t0 >= res_len) return;
  const T* kr = static_cast<const T*>(p.k_res) + b * p.kr_sb + h * p.kr_sh;
  const T* vr = static_cast<const T*>(p.v_res) + b * p.vr_sb + h * p.vr_sh;
  const uint32_t kt_base = smem_addr(tile), vt_base = kt_base + kTile;
  auto issue = [&](int first) {
#pragma unroll
    for (int i = 0; i < kGroup * kChunks / 32; ++i) {
      const int idx = lane + 32 * i, t = idx / kChunks, ch = idx % kChunks;
      const bool ok = first + t < res_len;
      const int64_t row = ok ? first + t : first;  // a valid address either way
      const uint32_t off = window_tile_offset<D>(t, ch);
      cp_async16_zfill(kt_base + off, kr + row * p.kr_st + 8 * ch, ok);
      cp_async16_zfill(vt_base + off, vr + row * p.vr_st + 8 * ch, ok);
    }
    cp_async_commit();
  };
  issue(t0);
  const int rows = p.group * p.lq;
  const T* qp = static_cast<const T*>(p.q);
  uint32_t qn[D / 16][NT][2];  // B = Q^T: k = channels 16 ks + 2c (+ 8 e), n = row 8 nt + g
  int lim[NT][2];  // query row 8 nt + 2c + hc (token a = row / group) sees window positions < lim
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = 8 * nt + g;
    const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + row % p.group;
    const T* qrow = qp + (head * p.lq + row / p.group) * D + 2 * c;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        qn[ks][nt][e] = row < rows ? __ldg(reinterpret_cast<const unsigned int*>(qrow + 16 * ks + 8 * e)) : 0u;
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) {
      const int r = 8 * nt + 2 * c + hc;
      lim[nt][hc] = r < rows ? res_len - p.lq + 1 + r / p.group : 0;
    }
  }
  // ldmatrix row addresses: lane = 8 j + r gives row r of matrix j.
  const int j = lane >> 3, r8 = lane & 7;
  for (; t0 < res_len; t0 += kGroup * kWarps) {
    cp_async_wait<0>();
    __syncwarp();
    float sc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.f;
      const int t = 16 * mt + r8 + 8 * (j & 1);  // matrices: (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, kt_base + window_tile_offset<D>(t, 2 * ks + (j >> 1)));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816_t<T>(sc[mt][nt], a, qn[ks][nt][0], qn[ks][nt][1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = t0 + 16 * mt + g + 8 * (e >> 1);
          sc[mt][nt][e] = t < lim[nt][e & 1] ? sc[mt][nt][e] * p.scale_log2 : -INFINITY;
        }
    uint32_t pb[2][NT][2];
    softmax_to_p<D, NT, 2, T>(sc, w, pb);
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) {
      // V^T tile (channels 16 mv.., tokens 16 kt..): matrix j = tokens + 8 (j >> 1), channels + 8 (j & 1), transposed.
      const int t = 16 * kt + r8 + 8 * (j >> 1);
#pragma unroll
      for (int mv = 0; mv < D / 16; ++mv) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, vt_base + window_tile_offset<D>(t, 2 * mv + (j & 1)));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816_t<T>(w.acc[mv][nt], a, pb[kt][nt][0], pb[kt][nt][1]);
      }
    }
    __syncwarp();  // the tiles are refilled next
    if (t0 + kGroup * kWarps < res_len) issue(t0 + kGroup * kWarps);
  }
}

// Merge the warps' states and write this split's partial (valid rows only), or with `direct` (a row of one CTA whose
// state holds its window too) the row's normalized output itself.
template <int D, int NT, typename T>
__device__ void write_partial(const DecodeParams& p, int64_t bh, int split, WarpState<D, NT>& w, DecodeSmem<D, NT>& sm,
                              bool direct) {
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
    if (direct) {
      const int b = static_cast<int>(bh / p.kv_heads), h = static_cast<int>(bh % p.kv_heads);
      const int64_t head = static_cast<int64_t>(b) * p.kv_heads * p.group + h * p.group + r % p.group;
      static_cast<T*>(p.out)[(head * p.lq + r / p.group) * D + d] = from_float<T>(o / l);
      continue;
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

// Two head tiles (9-16 query rows) take more registers: at most 2 CTAs an SM (1 in the 8-warp build).
template <int NT>
struct MinBlocks {
  static constexpr int value = NT == 1 || OSCAR_MIN_BLOCKS < 2 ? OSCAR_MIN_BLOCKS : 2;
};

template <int D, int NT, typename T, bool kGroups>
__global__ void __launch_bounds__(kThreads, MinBlocks<NT>::value) decode_split_kernel(const DecodeParams p);

}  // namespace oscar

#include "oscar_combine.cuh"
