// OScaR decode, quantized part, over codes in the "mma" order (quant/packed.py mma_slots): each lane
// loads its own tensor-core B-fragment codes with 16-byte loads straight into registers (no shared-memory
// staging, no transposes), dequantizes them to exact fp16 integers c (one LOP3 + one HSUB2 per code pair,
// one shift per word), and the group's scales and zeros are folded into the other MMA operand:
//   keys   (scale s_d, zero z_d per channel):  s_j = sum_d (q_d s_d) c_jd + sum_d q_d z_d
//          -> A = Q * s (4 HMUL2 per k-step), plus one bias MMA per k-step with B = z broadcast;
//   values (scale s_t,g, zero z_t,g per token and 32-channel group g):
//          o_ch = sum_t (p_t s_t,g) c_t,ch + sum_t p_t z_t,g
//          -> A = P * s_g (4 HMUL2 per (k-step, g)), plus one MMA per k-step into zacc (column = g),
//             added to the accumulators once at the end (write_partial).
#pragma once
#include "oscar_common.cuh"

namespace oscar {

// Field P (0..7) of both halves of word x as a half2 of exact integers (c_lo, c_hi). Fields 0..4 are
// read in place: OR-ing the field at mantissa bits 2q..2q+1 into fp16 2^(10-2q) gives 2^(10-2q) + c
// exactly; fields 5..7 come from x8 = x >> 8 (fields 1..3 there).
template <int P>
__device__ __forceinline__ uint32_t code_pair(uint32_t x, uint32_t x8) {
  constexpr int q = P < 5 ? P : P - 4;
  constexpr uint32_t magic = ((25u - 2u * q) << 10) * 0x10001u;  // fp16 2^(10-2q) in both halves
  const uint32_t u = ((P < 5 ? x : x8) & (0x00030003u << (2 * q))) | magic;
  return as_u32(__hsub2(as_half2(u), as_half2(magic)));
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  return as_u32(__hmul2(as_half2(a), as_half2(b)));
}

__device__ __forceinline__ uint32_t ldg_u32(const __half* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

template <int D>
struct MmaCodes {  // one group's codes of this lane: D/16 words each (D/64 16-byte vectors)
  uint4 k[D / 64], v[D / 64];
};

template <int D>
__device__ __forceinline__ void mma_load_codes(MmaCodes<D>& r, const DecodeParams& p, int64_t blk) {
  const int lane = threadIdx.x & 31;
  const uint4* kc = reinterpret_cast<const uint4*>(p.kc + blk * 2 * D) + lane * (D / 64);
  const uint4* vc = reinterpret_cast<const uint4*>(p.vc + blk * 2 * D) + lane * (D / 64);
#pragma unroll
  for (int i = 0; i < D / 64; ++i) r.k[i] = __ldg(kc + i), r.v[i] = __ldg(vc + i);
}

// The scale/zero/norm lines of block blk into L1 ahead of use (lanes 0..: one 128-byte line each).
template <int D>
__device__ __forceinline__ void mma_prefetch_scales(const DecodeParams& p, int64_t blk, int b, int gi) {
  const int lane = threadIdx.x & 31;
  constexpr int kLines = D * 2 / 128;  // lines per key scale row = per value scale block
  const char* base = nullptr;
  int line = lane;
  if (line < kLines) base = reinterpret_cast<const char*>(p.ks + blk * D);
  else if ((line -= kLines) < kLines) base = reinterpret_cast<const char*>(p.kz + blk * D);
  else if ((line -= kLines) < kLines) base = reinterpret_cast<const char*>(p.vs + blk * D);
  else if ((line -= kLines) < kLines) base = reinterpret_cast<const char*>(p.vz + blk * D);
  else if (line == kLines) base = reinterpret_cast<const char*>(p.norms + static_cast<int64_t>(b) * p.tokens + kGroup * gi), line = 0;
  if (base) prefetch_l1(base + 128 * line);
}

// Scores of one group: sc[j] = tile of tokens 8j..8j+7 (before scaling and masking).
template <int D>
__device__ __forceinline__ void mma_scores(const uint4 (*qa)[32], const uint32_t (&kw)[D / 16], const __half* ks,
                                           const __half* kz, float sc[4][4]) {
  const int lane = threadIdx.x & 31, c = lane & 3;
  float bias[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
  for (int kstep = 0; kstep < D / 16; ++kstep) {
    const int ch = 16 * kstep + 2 * c;
    const uint32_t s_lo = ldg_u32(ks + ch), s_hi = ldg_u32(ks + ch + 8);
    const uint32_t z_lo = ldg_u32(kz + ch), z_hi = ldg_u32(kz + ch + 8);
    const uint4 a4 = qa[kstep][lane];
    const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
    const uint32_t as[4] = {hmul2_u32(a[0], s_lo), hmul2_u32(a[1], s_lo), hmul2_u32(a[2], s_hi), hmul2_u32(a[3], s_hi)};
    mma16816(bias, a, z_lo, z_hi);  // every column: sum_d q_d z_d of rows g, g + 8
    const uint32_t x = kw[kstep], x8 = x >> 8;
    mma16816(sc[0], as, code_pair<0>(x, x8), code_pair<1>(x, x8));
    mma16816(sc[1], as, code_pair<2>(x, x8), code_pair<3>(x, x8));
    mma16816(sc[2], as, code_pair<4>(x, x8), code_pair<5>(x, x8));
    mma16816(sc[3], as, code_pair<6>(x, x8), code_pair<7>(x, x8));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] += bias[e];
}

// Value scales of token t for all D/32 channel groups (zero where t >= valid: masked p = 0 must stay 0).
template <int D>
__device__ __forceinline__ void token_scales(const __half* vs, int t, int valid, __half (&out)[D / 32]) {
  if constexpr (D == 128) {
    uint2 u = t < valid ? __ldg(reinterpret_cast<const uint2*>(vs + 4 * t)) : make_uint2(0u, 0u);
    const __half* h = reinterpret_cast<const __half*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = h[i];
  } else {
    uint32_t u = t < valid ? __ldg(reinterpret_cast<const uint32_t*>(vs + 2 * t)) : 0u;
    const __half* h = reinterpret_cast<const __half*>(&u);
    out[0] = h[0], out[1] = h[1];
  }
}

__device__ __forceinline__ uint32_t half_pair(__half a, __half b) { return as_u32(__halves2half2(a, b)); }

// O += P V_hat for one group (P as A fragments, unscaled), codes vw of this lane.
template <int D>
__device__ __forceinline__ void mma_pv(const uint32_t pa[2][4], const uint32_t (&vw)[D / 16], const __half* vs,
                                       const __half* vz, int valid, Frag<D>& f) {
  constexpr int kCg = D / 32;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  __half sv[2][2][2][kCg];  // [kt][r][h]: token 16 kt + 8 r + 2 c + h
#pragma unroll
  for (int kt = 0; kt < 2; ++kt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = 16 * kt + 8 * r + 2 * c;
      token_scales<D>(vs, t, valid, sv[kt][r][0]);
      token_scales<D>(vs, t + 1, valid, sv[kt][r][1]);
    }
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {  // zero bias: column g of B is channel group g
    uint32_t zb[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = 16 * kt + 8 * r + 2 * c;
      const bool ok = g < kCg;
      const __half z0 = ok && t < valid ? vz[kCg * t + g] : __float2half(0.f);
      const __half z1 = ok && t + 1 < valid ? vz[kCg * (t + 1) + g] : __float2half(0.f);
      zb[r] = half_pair(z0, z1);
    }
    mma16816(f.zacc, pa[kt], zb[0], zb[1]);
  }
#pragma unroll
  for (int cg = 0; cg < kCg; ++cg) {
    uint32_t ps[2][4];
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) {
      const uint32_t s0 = half_pair(sv[kt][0][0][cg], sv[kt][0][1][cg]);
      const uint32_t s1 = half_pair(sv[kt][1][0][cg], sv[kt][1][1][cg]);
      ps[kt][0] = hmul2_u32(pa[kt][0], s0), ps[kt][1] = hmul2_u32(pa[kt][1], s0);
      ps[kt][2] = hmul2_u32(pa[kt][2], s1), ps[kt][3] = hmul2_u32(pa[kt][3], s1);
    }
#pragma unroll
    for (int w2 = 0; w2 < 2; ++w2) {  // words 2 cg + w2 hold n = 4 cg + 2 w2 + {0, 1}
      const uint32_t x = vw[2 * cg + w2], x8 = x >> 8;
      float* a0 = f.acc[4 * cg + 2 * w2];
      float* a1 = f.acc[4 * cg + 2 * w2 + 1];
      mma16816(a0, ps[0], code_pair<0>(x, x8), code_pair<1>(x, x8));
      mma16816(a0, ps[1], code_pair<2>(x, x8), code_pair<3>(x, x8));
      mma16816(a1, ps[0], code_pair<4>(x, x8), code_pair<5>(x, x8));
      mma16816(a1, ps[1], code_pair<6>(x, x8), code_pair<7>(x, x8));
    }
  }
}

template <int D>
__device__ void quantized_part_mma(const DecodeParams& p, int b, int64_t bh, int split, const uint4 (*qa)[32],
                                   Frag<D>& f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane & 3;
  const int kv_len = p.kv_lens[b];
  const int start = split * p.split_tokens;
  const int end = min(start + p.split_tokens, kv_len);
  const int g_end = (end + kGroup - 1) / kGroup;
  int gi = start / kGroup + warp;
  if (gi >= g_end) return;
  const int64_t t32 = p.tokens / kGroup, blk0 = bh * t32;
  MmaCodes<D> next;
  mma_load_codes<D>(next, p, blk0 + gi);
  mma_prefetch_scales<D>(p, blk0 + gi, b, gi);
  for (; gi < g_end; gi += kWarps) {
    uint32_t kw[D / 16], vw[D / 16];
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
      kw[4 * i] = next.k[i].x, kw[4 * i + 1] = next.k[i].y, kw[4 * i + 2] = next.k[i].z, kw[4 * i + 3] = next.k[i].w;
      vw[4 * i] = next.v[i].x, vw[4 * i + 1] = next.v[i].y, vw[4 * i + 2] = next.v[i].z, vw[4 * i + 3] = next.v[i].w;
    }
    if (gi + kWarps < g_end) {  // the next group's codes and scale lines are in flight during the math
      mma_load_codes<D>(next, p, blk0 + gi + kWarps);
      mma_prefetch_scales<D>(p, blk0 + gi + kWarps, b, gi + kWarps);
    }
    const int64_t blk = blk0 + gi;
    const int valid = kv_len - kGroup * gi;
    float sc[4][4];
    mma_scores<D>(qa, kw, p.ks + blk * D, p.kz + blk * D, sc);
    const float* nrm = p.norms + static_cast<int64_t>(b) * p.tokens + kGroup * gi;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = 8 * j + 2 * c;
      const float2 n = __ldg(reinterpret_cast<const float2*>(nrm + t));
      sc[j][0] = t < valid ? sc[j][0] * p.scale_log2 * n.x : -INFINITY;
      sc[j][1] = t + 1 < valid ? sc[j][1] * p.scale_log2 * n.y : -INFINITY;
      sc[j][2] = t < valid ? sc[j][2] * p.scale_log2 * n.x : -INFINITY;
      sc[j][3] = t + 1 < valid ? sc[j][3] * p.scale_log2 * n.y : -INFINITY;
    }
    uint32_t pa[2][4];
    softmax_step<D>(sc, f, pa);
    mma_pv<D>(pa, vw, p.vs + blk * D, p.vz + blk * D, valid, f);
  }
}

}  // namespace oscar
