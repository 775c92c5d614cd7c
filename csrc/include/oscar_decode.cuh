// OScaR split-KV decode attention over the packed INT2 cache (layout: quant/packed.py), tensor cores.
//
// Grid (num_splits + 1, B * Hkv), 4 warps. The GQA heads of one KV head times the Lq query tokens are
// the M = 16 rows of an mma.m16n8k16 tile (row r: token r / group, head h * group + r % group), so each
// loaded code serves all of them. Each warp walks 32-token groups of its CTA's split:
//   S = (Q Hd) K_hat^T (channels in K, tokens in N), s_j *= scaling * n_j, online softmax (base 2),
//   O += P V_hat (tokens in K, channels in N), codes dequantized straight into B fragments.
// The last CTA of each (b, h) attends to the full-precision residual window with Q (not rotated).
// Warps merge in shared memory and write one partial (o, m, l) per split; the combine kernel merges
// splits by log-sum-exp and rotates the quantized part back: out = (fwht(O_q) / sqrt(D) + O_r) / L.
#pragma once
#include "oscar_common.cuh"

namespace oscar {

struct DecodeParams {
  const void* q;  // [B, Hq, LQ, D], dtype T (the residual window's dtype)
  const int32_t* kc;  // [B, Hkv, T/16, D]
  const __half* ks;   // [B, Hkv, T/32, D]
  const __half* kz;
  const int32_t* vc;  // [B, Hkv, T, D/16]
  const __half* vs;   // [B, Hkv, T, D/32]
  const __half* vz;
  const float* norms;  // [B, T]
  const void* k_res;   // [B, Hkv, Tr, D] with the strides below (elements), last dim contiguous
  const void* v_res;
  int64_t kr_sb, kr_sh, kr_st, vr_sb, vr_sh, vr_st;
  const int32_t* kv_lens;   // [B] valid quantized tokens
  const int32_t* res_lens;  // [B] valid residual tokens
  float* part_o;   // [B * Hkv, splits + 1, rows, D]
  float* part_ml;  // [B * Hkv, splits + 1, 2, rows]
  void* out;       // [B, Hq, LQ, D], dtype T
  int kv_heads, group, lq, tokens, num_splits, split_tokens;
  float scale_log2;  // scaling * log2(e)
  bool rotate;       // Hd is the Sylvester Hadamard (else identity)
};

template <int D>
struct WarpStage {  // one 32-token group, staged per warp
  uint32_t kw[2][D];            // key words: row r = tokens 16r..16r+15, one word per channel
  __half ksz[D / 2][4];         // per channel pair: (s4_a, s4_b, z4_a, z4_b), one 8-byte load
  uint32_t vw[D / 16][kGroup];  // value words transposed: [word][token]
  __half vsz[D / 32][kGroup / 2][4];  // per (channel group, token pair): (s4_a, s4_b, z4_a, z4_b)
  float norm[kGroup];
};

template <int D>
struct DecodeSmem {
  union {  // the warps' final accumulators reuse the staging space (a barrier separates the two uses)
    struct {
      WarpStage<D> stage[kWarps];
      float q[16][D];  // query rows (rotated for quantized CTAs) before they become A fragments
    } work;
    float acc[kWarps][16][D];
  };
  uint4 qa[D / 16][32];  // the A fragments, per k-step and lane (shared: registers are the scarce part)
  float m[kWarps][16], l[kWarps][16];
};

template <int D>
struct Frag {  // one warp's running state: rows g and g + 8
  float acc[D / 8][4];
  float m[2], l[2];
};

// Global -> registers for one group (each lane: 16-byte vectors), then registers -> shared.
template <int D>
struct GroupRegs {
  static constexpr int kKW = 2 * D / 4 / 32;  // int4 of key words per lane (2 for D=128, 1 for 64)
  static constexpr int kVW = kGroup * D / 16 / 4 / 32;
  int4 kw[kKW], vw[kVW];
  int4 ksz, vsz;  // lanes < half: scales, others: zeros (each 16 bytes)
  float norm;
};

template <int D>
__device__ __forceinline__ void load_group(GroupRegs<D>& r, const DecodeParams& p, int64_t bh, int b, int gi) {
  const int lane = threadIdx.x & 31;
  const int64_t t16 = p.tokens / 16, t32 = p.tokens / 32;
  const int4* kw = reinterpret_cast<const int4*>(p.kc + (bh * t16 + 2 * gi) * D);
#pragma unroll
  for (int i = 0; i < r.kKW; ++i) r.kw[i] = __ldg(kw + lane + 32 * i);
  const int4* vw = reinterpret_cast<const int4*>(p.vc + (bh * p.tokens + kGroup * gi) * (D / 16));
#pragma unroll
  for (int i = 0; i < r.kVW; ++i) r.vw[i] = __ldg(vw + lane + 32 * i);
  constexpr int kS = D / 8;  // int4 per key scale row (16 for D=128)
  const int64_t srow = (bh * t32 + gi) * D;
  if (lane < kS) r.ksz = __ldg(reinterpret_cast<const int4*>(p.ks + srow) + lane);
  else if (lane < 2 * kS) r.ksz = __ldg(reinterpret_cast<const int4*>(p.kz + srow) + lane - kS);
  constexpr int kV = kGroup * (D / 32) / 8;  // int4 per value scale block (16 for D=128)
  const int64_t vrow = (bh * p.tokens + kGroup * gi) * (D / 32);
  if (lane < kV) r.vsz = __ldg(reinterpret_cast<const int4*>(p.vs + vrow) + lane);
  else if (lane < 2 * kV) r.vsz = __ldg(reinterpret_cast<const int4*>(p.vz + vrow) + lane - kV);
  r.norm = p.norms[static_cast<int64_t>(b) * p.tokens + kGroup * gi + lane];
}

// `valid` = tokens of the group below kv_len: the others get value scale/zero 0, so that their (masked,
// p = 0) values are exactly 0 even where the stored bytes are not finite numbers.
template <int D>
__device__ __forceinline__ void store_group(const GroupRegs<D>& r, WarpStage<D>& s, int valid) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < r.kKW; ++i) reinterpret_cast<int4*>(&s.kw[0][0])[lane + 32 * i] = r.kw[i];
#pragma unroll
  for (int i = 0; i < r.kVW; ++i) {  // element e = token * (D/16) + word -> vw[word][token]
    const int e = 4 * (lane + 32 * i);
    const int w[4] = {r.vw[i].x, r.vw[i].y, r.vw[i].z, r.vw[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) s.vw[(e + j) % (D / 16)][(e + j) / (D / 16)] = w[j];
  }
  constexpr int kS = D / 8;
  const int4 ksz = fold_scale_zero(r.ksz, kS);  // all lanes: the shuffles need the full warp
  if (lane < 2 * kS) {  // 4 channel pairs per lane: scales into .x, zeros into .y of each pair
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&ksz);
    const int pair0 = 4 * (lane < kS ? lane : lane - kS), half = lane < kS ? 0 : 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) reinterpret_cast<uint32_t*>(s.ksz[pair0 + j])[half] = w[j];
  }
  constexpr int kV = kGroup * (D / 32) / 8;
  const int4 vsz = fold_scale_zero(r.vsz, kV);
  if (lane < 2 * kV) {  // element e = token * (D/32) + group -> v{s,z}[group][token]
    const __half* h = reinterpret_cast<const __half*>(&vsz);
    const int base = 8 * (lane < kV ? lane : lane - kV);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = base + j;
      const int t = e / (D / 32);
      s.vsz[e % (D / 32)][t / 2][(lane < kV ? 0 : 2) + (t & 1)] = t < valid ? h[j] : __float2half(0.f);
    }
  }
  s.norm[lane] = r.norm;
}

// Online softmax step for the 4 score tiles (32 tokens) of this warp; returns P as A fragments.
template <int D>
__device__ __forceinline__ void softmax_step(float sc[4][4], Frag<D>& f, uint32_t pa[2][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // half 0: row g (elements 0, 1); half 1: row g + 8
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * half], sc[j][2 * half + 1]));
    const float m_new = fmaxf(f.m[half], quad_max(mx));
    const float alpha = exp2f(f.m[half] - m_new);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j][2 * half] = exp2f(sc[j][2 * half] - m_new);
      sc[j][2 * half + 1] = exp2f(sc[j][2 * half + 1] - m_new);
      sum += sc[j][2 * half] + sc[j][2 * half + 1];
    }
    f.l[half] = f.l[half] * alpha + sum;  // lane-partial; summed over the quad at the end
    f.m[half] = m_new;
    // Lazy rescale: once the running max settles, alpha == 1 for every row of the warp and the 2 * D / 8
    // multiplies are skipped (a warp-uniform branch).
    if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        f.acc[n][2 * half] *= alpha;
        f.acc[n][2 * half + 1] *= alpha;
      }
    }
  }
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {  // C fragments of tiles 2kt, 2kt+1 are the A fragment of k-step kt
    pa[kt][0] = pack_half2(sc[2 * kt][0], sc[2 * kt][1]);
    pa[kt][1] = pack_half2(sc[2 * kt][2], sc[2 * kt][3]);
    pa[kt][2] = pack_half2(sc[2 * kt + 1][0], sc[2 * kt + 1][1]);
    pa[kt][3] = pack_half2(sc[2 * kt + 1][2], sc[2 * kt + 1][3]);
  }
}

// Scores of one staged group: sc[j] = tile of tokens 8j..8j+7 (log2 units, masked).
template <int D>
__device__ __forceinline__ void group_scores(const WarpStage<D>& s, const uint4 (*qa)[32], int valid,
                                             float scale_log2, float sc[4][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint32_t sel = gather_selector(g), sh = 2 * (g & 3);
#pragma unroll
  for (int j = 0; j < 4; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int ch = 16 * ks + 2 * c;
    const uint4 a4 = qa[ks][lane];
    const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
    const uint2 lo = *reinterpret_cast<const uint2*>(s.ksz[ch / 2]);
    const uint2 hi = *reinterpret_cast<const uint2*>(s.ksz[ch / 2 + 4]);
    const __half2 s_lo = as_half2(lo.x), z_lo = as_half2(lo.y), s_hi = as_half2(hi.x), z_hi = as_half2(hi.y);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint2 wl = *reinterpret_cast<const uint2*>(&s.kw[r][ch]);
      const uint2 wh = *reinterpret_cast<const uint2*>(&s.kw[r][ch + 8]);
      const uint32_t ul = gather_codes(wl.x, wl.y, sel, sh), uh = gather_codes(wh.x, wh.y, sel, sh);
      mma16816(sc[2 * r], a, dequant2(ul << 8, s_lo, z_lo), dequant2(uh << 8, s_hi, z_hi));
      mma16816(sc[2 * r + 1], a, dequant2(ul, s_lo, z_lo), dequant2(uh, s_hi, z_hi));
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = 8 * j + 2 * c + (e & 1);
      sc[j][e] = t < valid ? sc[j][e] * scale_log2 * s.norm[t] : -INFINITY;
    }
}

// O += P V_hat for one staged group.
template <int D>
__device__ __forceinline__ void group_pv(const WarpStage<D>& s, const uint32_t pa[2][4], Frag<D>& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint32_t sel = gather_selector(g), sh = 2 * (g & 3);
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
    const int t = 16 * kt + 2 * c;
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
      const uint2 va = *reinterpret_cast<const uint2*>(s.vsz[i / 2][t / 2]);
      const uint2 vb = *reinterpret_cast<const uint2*>(s.vsz[i / 2][t / 2 + 4]);
      const __half2 sa = as_half2(va.x), za = as_half2(va.y), sb = as_half2(vb.x), zb = as_half2(vb.y);
      const uint2 wa = *reinterpret_cast<const uint2*>(&s.vw[i][t]);
      const uint2 wb = *reinterpret_cast<const uint2*>(&s.vw[i][t + 8]);
      const uint32_t ua = gather_codes(wa.x, wa.y, sel, sh), ub = gather_codes(wb.x, wb.y, sel, sh);
      mma16816(f.acc[2 * i], pa[kt], dequant2(ua << 8, sa, za), dequant2(ub << 8, sb, zb));
      mma16816(f.acc[2 * i + 1], pa[kt], dequant2(ua, sa, za), dequant2(ub, sb, zb));
    }
  }
}

// A fragments of the 16 query rows staged in shared memory (fp32) -> fp16 fragments in shared memory,
// written by warp 0 (the caller synchronizes).
template <int D>
__device__ __forceinline__ void query_frags(const float (*q)[D], uint4 (*qa)[32]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  if (threadIdx.x >= 32) return;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int k = 16 * ks + 2 * c;
    qa[ks][lane] = make_uint4(pack_half2(q[g][k], q[g][k + 1]), pack_half2(q[g + 8][k], q[g + 8][k + 1]),
                              pack_half2(q[g][k + 8], q[g][k + 9]), pack_half2(q[g + 8][k + 8], q[g + 8][k + 9]));
  }
}

}  // namespace oscar

#include "oscar_decode_impl.cuh"
