// OScaR split-KV decode attention over the packed INT2 cache in the "frag" code order (oscar_layout.cuh).
//
// Grid (max(num_splits, 1), B * Hkv), kWarps warps (4, or 8-12 with one CTA an SM); the last split's CTA of each
// (b, kv head) also attends to the full-precision window, and the last CTA to finish (a counter per (b, kv head))
// merges the partials (oscar_combine.cuh). Rows of one CTA (one split, the window folded, V's rotation in the weights, short rows) run
// decode_row_kernel instead: the window after the groups in the same state, the output written directly.
// Products are transposed so that the 32 tokens of a group fill the tensor core's M = 16 rows twice and the
// GQA heads x query tokens sit in N = 8 columns (NT tiles of 8):
//   S^T = K_hat Q^T     (A = key codes straight from shared memory, k = channels; B = Q scaled per channel)
//   O^T += V_hat^T P^T  (A = value codes, k = tokens; B = P scaled per token, moved into place by movmatrix)
// Codes enter as fp16 subnormals c 2^(p - 24) (code_slot: one LOP3 a register after the slot's shift, no offset),
// so the scales multiply the B operands (Q by the key scale, P by the value scale). Keys: the slot's bit p is
// 2 (ks & 3) on k-step ks, whose query fragments hold q 2^-p, so every product is c q s 2^-24; the zeros' sums
// sum_d q_d z_d per group are MMAs with A = z and B = q (unscaled), exact products (every group starts its scores
// from zero). Values: mirrored on odd tokens: the odd token's
// code is complemented (3 - q, in the same LOP3) and its P negated, so its term is (q - 3) s p, and its zero enters
// as z + 3 s. The running sum O^T then takes q s p and (q - 3) s p in turn and carries no offset along a split; the
// zeros' sum Z = sum_t z'_t p_t per channel group is one MMA (A rows: z, or z + 3 s on odd tokens), added as
// O = 2^(24 - p) O^T + Z at the end of the quantized part (fold_values). An offset carried along a split (as the
// codes' B = 4 or 16 of the fp16 trick, or even their mean 1.5) grows the sum past the output's size while O averages
// down, and the tensor cores' fp32 sums drop low bits at every step: an error that grew with the tokens a CTA reads
// (the figures: docs/KERNELS.md, Decode accuracy).
// Each warp streams its own groups through a kStages-deep cp.async pipeline (no block barriers).
#pragma once
#include "oscar_common.cuh"
#include "oscar_layout.cuh"

namespace oscar {

struct DecodeParams {
  const void* q;  // [B, Hq, LQ, D], dtype T (the residual window's dtype)
  const int32_t* kc;  // [B, Hkv, T/16, D] frag order
  const __half* ks;   // [B, Hkv, T/32, D]
  const __half* kz;
  const int32_t* vc;  // [B, Hkv, T, D/16] frag order
  const __half* vs;   // [B, Hkv, T, D/32], per block [D/32][32]
  const __half* vz;
  const float* norms;  // [B, T]
  const void* k_res;   // [B, Hkv, Tr, D] with the strides below (elements), last dim contiguous
  const void* v_res;
  int64_t kr_sb, kr_sh, kr_st, vr_sb, vr_sh, vr_st;
  const int32_t* kv_lens;   // [B] valid quantized tokens
  const int32_t* res_lens;  // [B] valid residual tokens
  float* part_o;   // [B * Hkv, splits + 1, rows, D]
  float* part_ml;  // [B * Hkv, splits + 1, 2, rows]
  int32_t* counters;  // [B * Hkv], zero between calls (the last CTA of each (b, h) resets its entry)
  void* out;       // [B, Hq, LQ, D], dtype T
  int kv_heads, group, lq, tokens, num_splits, split_tokens;
  float scale_log2;  // scaling * log2(e)
  bool rotate;       // the keys are K Hd (Hd the Sylvester Hadamard): the query is rotated
  bool rotate_out;   // the quantized values are V Hd: the merged output is rotated back (false: V's rotation is
                     // folded into the model's v_proj / o_proj, quant/fold.py, and the output stays as it is)
  bool window_cta;   // the window has its own CTA, blockIdx.x 0 (scheduled first); else it is folded into the
                     // last split's CTA
  int order;         // which CTA of the grid does which (split, row) (cta_work): 0 row by row; 1 each row's special
                     // CTA (the window's own, or the last split carrying the folded window) first, for all rows, then
                     // the others row by row; any other value: the special CTAs last
  int merge_group;   // > 0 (with window_cta): a two-level merge, the last CTA of each group of merge_group quantized
                     // splits merges the group first (oscar_combine.cuh); counters then holds B * Hkv * (1 + groups)
  unsigned long long* trace;  // diagnostics, usually null: per CTA [7] %globaltimer stamps + SM id (kTraceSlots)
};

constexpr int kTraceSlots = 8;

__device__ __forceinline__ void trace_stamp(const DecodeParams& p, int slot) {
  if (p.trace == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const int64_t cta = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  p.trace[cta * kTraceSlots + slot] = t;
  if (slot == 0) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    p.trace[cta * kTraceSlots + kTraceSlots - 1] = sm;
  }
}

// One 32-token group in shared memory, byte offsets (the same bytes as in global memory, region by region).
template <int D>
struct Stage {
  static constexpr int kKC = 0, kKS = 8 * D, kKZ = kKS + 2 * D, kVC = kKZ + 2 * D, kVS = kVC + 8 * D,
                       kVZ = kVS + 2 * D, kNorm = kVZ + 2 * D, kBytes = kNorm + 128;
};

template <int D, int NT>
struct WarpState {
  float acc[D / 16][NT][4];  // O^T: channel tile mv (rows 16 mv + g, + 8), head tile nt (cols 2c, 2c + 1)
  float zacc[NT][4];         // rows < D/32: Z of channel group g (sum of z' x p); other rows zero
  float m[NT][2], l[NT][2];  // per column (head 8 nt + 2c + e); l is lane-partial until the end
};

constexpr float kNegInit = -1.0e30f;  // finite: fully masked tiles give exp2(-inf) = 0, never NaN

template <int D, int NT>
__device__ __forceinline__ void init_state(WarpState<D, NT>& w) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      w.zacc[nt][e] = 0.f;
#pragma unroll
      for (int mv = 0; mv < D / 16; ++mv) w.acc[mv][nt][e] = 0.f;
    }
    w.m[nt][0] = w.m[nt][1] = kNegInit;
    w.l[nt][0] = w.l[nt][1] = 0.f;
  }
}

// Online softmax over MT score tiles (log2 units, masked); P (pairs of PT: fp16, or bf16 for a bf16 window) as
// B fragments of O^T += V^T P^T.
template <int D, int NT, int MT, typename PT = __half>
__device__ __forceinline__ void softmax_to_p(float (&sc)[MT][NT][4], WarpState<D, NT>& w, uint32_t (&pb)[MT][NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float alpha[2];
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) {
      float mx = -INFINITY;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mx = fmaxf(mx, fmaxf(sc[mt][nt][hc], sc[mt][nt][2 + hc]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(w.m[nt][hc], mx);
      alpha[hc] = fast_exp2(w.m[nt][hc] - m_new);
      w.m[nt][hc] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        sc[mt][nt][hc] = fast_exp2(sc[mt][nt][hc] - m_new);
        sc[mt][nt][2 + hc] = fast_exp2(sc[mt][nt][2 + hc] - m_new);
        sum += sc[mt][nt][hc] + sc[mt][nt][2 + hc];
      }
      w.l[nt][hc] = w.l[nt][hc] * alpha[hc] + sum;
    }
    // Lazy rescale: once the running maxima settle, alpha == 1 across the warp and the multiplies are skipped.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        w.zacc[nt][e] *= alpha[e & 1];
#pragma unroll
        for (int mv = 0; mv < D / 16; ++mv) w.acc[mv][nt][e] *= alpha[e & 1];
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {  // C rows g / g + 8 (tokens) x cols (heads) -> B (k = tokens, n = head)
      pb[mt][nt][0] = movmatrix_trans(pack2<PT>(sc[mt][nt][0], sc[mt][nt][1]));
      pb[mt][nt][1] = movmatrix_trans(pack2<PT>(sc[mt][nt][2], sc[mt][nt][3]));
    }
  }
}

// One staged group: scores, softmax, O^T and the Y/Z sums. valid = tokens of the group below kv_len.
template <int D, int NT>
__device__ __forceinline__ void group_step(unsigned char* st, const uint32_t (&qf)[D / 16][NT][2],
                                           const uint32_t (&qk)[D / 16][NT][2], WarpState<D, NT>& w, int valid,
                                           float scale_log2) {
  using L = Stage<D>;
  constexpr int KS = D / 16, NDG = D / 32;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const bool tail = valid < kGroup;  // warp-uniform: only a sequence's last group
  if (tail) {  // value scales and zeros of tokens at or past `valid` -> 0 (their p is 0; the bytes may be NaN)
    __half* vsz = reinterpret_cast<__half*>(st + L::kVS);  // [2 NDG][32]: scales then zeros, per block
    for (int idx = lane; idx < 2 * NDG * kGroup; idx += 32)
      if (idx % kGroup >= valid) vsz[idx] = __float2half(0.f);
    __syncwarp();
  }

  uint32_t kw[KS];
#pragma unroll
  for (int j = 0; j < KS / 4; ++j) {
    const uint4 x = *reinterpret_cast<const uint4*>(st + L::kKC + 16 * (32 * j + lane));
    kw[4 * j] = x.x, kw[4 * j + 1] = x.y, kw[4 * j + 2] = x.z, kw[4 * j + 3] = x.w;
  }
  // Scores in units of 2^-24. The zeros' sums q.z take the chunk's z as loaded for A: rows g hold the channels of
  // its e = 0 halves, rows g + 8 those of e = 1 (k-steps 2 i and 2 i + 1 side by side), so zb[0] (B: the query's
  // e = 0 pairs) is right in rows g and zb[1] (e = 1) in rows g + 8; the other rows are not read.
  float sc[2][NT][4], zb[2][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[0][nt][e] = sc[1][nt][e] = zb[0][nt][e] = zb[1][nt][e] = 0.f;
#pragma unroll
  for (int i = 0; i < KS / 2; ++i) {  // channel chunk 4 i + c: k-steps 2 i, 2 i + 1
    const uint4 s4 = *reinterpret_cast<const uint4*>(st + L::kKS + 16 * (4 * i + c));
    const uint4 z4 = *reinterpret_cast<const uint4*>(st + L::kKZ + 16 * (4 * i + c));
    const uint32_t sv[4] = {s4.x, s4.y, s4.z, s4.w}, za[4] = {z4.x, z4.y, z4.z, z4.w};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) mma16816(zb[e][nt], za, qf[2 * i][nt][e], qf[2 * i + 1][nt][e]);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int ks = 2 * i + kk;
      uint32_t bm[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) bm[nt][e] = as_u32(hmul2u(qk[ks][nt][e], sv[2 * kk + e]));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int f = (4 * mt + r) * KS + ks;  // compile-time after unrolling; slot & 3 = ks & 3
          a[r] = code_pair<D, false>(kw[f >> 3], f & 7);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816(sc[mt][nt], a, bm[nt][0], bm[nt][1]);
      }
    }
  }
  float zs[NT][2];  // q.z of column 2c + hc in units of 2^-24
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) zs[nt][hc] = (zb[0][nt][hc] + zb[1][nt][2 + hc]) * 0x1p-24f;
  // Token of C row g (e < 2) / g + 8 (e >= 2) in tile mt: base + 4 mt + 2 (e >> 1) (frag_token).
  const float* nrm = reinterpret_cast<const float*>(st + L::kNorm);
  const int base = 8 * (g >> 1) + (g & 1);
  const float scale24 = scale_log2 * 0x1p24f;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int t = base + 4 * mt + 2 * hf;
      const float f = nrm[t] * scale24;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) sc[mt][nt][2 * hf + hc] = (sc[mt][nt][2 * hf + hc] + zs[nt][hc]) * f;
      if (tail) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int hc = 0; hc < 2; ++hc)
            if (t >= valid) sc[mt][nt][2 * hf + hc] = -INFINITY;
      }
    }
  uint32_t pb[2][NT][2];
  softmax_to_p<D, NT, 2>(sc, w, pb);

  uint32_t vw[KS];
#pragma unroll
  for (int j = 0; j < KS / 4; ++j) {
    const uint4 x = *reinterpret_cast<const uint4*>(st + L::kVC + 16 * (32 * j + lane));
    vw[4 * j] = x.x, vw[4 * j + 1] = x.y, vw[4 * j + 2] = x.z, vw[4 * j + 3] = x.w;
  }
  // Lane c's tokens are 8c .. 8c + 7 (register x: tokens 8c + 2x, + 1 = B fragment e of step kt, x = 2 kt + e).
  {  // Z: A rows g < NDG are the zeros of channel group g, z + 3 s on odd tokens (high halves; one HFMA2 a pair)
    uint32_t zr[4] = {0u, 0u, 0u, 0u};
    if (g < NDG) {
      const uint4 s4 = *reinterpret_cast<const uint4*>(st + L::kVS + 16 * (4 * g + c));
      const uint4 z4 = *reinterpret_cast<const uint4*>(st + L::kVZ + 16 * (4 * g + c));
      const uint32_t sv[4] = {s4.x, s4.y, s4.z, s4.w}, zv[4] = {z4.x, z4.y, z4.z, z4.w};
      const __half2 mirror = __halves2half2(__float2half(0.f), __float2half(3.f));
#pragma unroll
      for (int i = 0; i < 4; ++i) zr[i] = as_u32(__hfma2(as_half2(sv[i]), mirror, as_half2(zv[i])));
    }
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) {
      const uint32_t a[4] = {zr[2 * kt], 0u, zr[2 * kt + 1], 0u};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816(w.zacc[nt], a, pb[kt][nt][0], pb[kt][nt][1]);
    }
  }
  uint32_t pm[2][NT][2];  // P for the codes: odd tokens (high halves) negated, as their codes are mirrored
#pragma unroll
  for (int kt = 0; kt < 2; ++kt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) pm[kt][nt][e] = pb[kt][nt][e] ^ 0x80000000u;
#pragma unroll
  for (int dg = 0; dg < NDG; ++dg) {
    const uint4 s4 = *reinterpret_cast<const uint4*>(st + L::kVS + 16 * (4 * dg + c));
    const uint32_t sv[4] = {s4.x, s4.y, s4.z, s4.w};
    uint32_t bm[2][NT][2];
#pragma unroll
    for (int kt = 0; kt < 2; ++kt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) bm[kt][nt][e] = as_u32(hmul2u(pm[kt][nt][e], sv[2 * kt + e]));
#pragma unroll
    for (int mh = 0; mh < 2; ++mh) {
      const int mv = 2 * dg + mh;
#pragma unroll
      for (int kt = 0; kt < 2; ++kt) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int f = (4 * kt + r) * KS + mv;
          a[r] = code_pair<D, true>(vw[f >> 3], f & 7);  // (q, 3 - q) x 2^(pos - 24)
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816(w.acc[mv][nt], a, bm[kt][nt][0], bm[kt][nt][1]);
      }
    }
  }
}

// O = 2^(24 - p) O^T + Z (the codes' sum in units of their subnormal, p = SlotMap<D>::pos of the tile's slot, plus
// the zeros'; Z of channel group dg sits in row dg of zacc, lane 4 dg + c), at the end of the quantized part: the
// window, when it follows in the same state, adds to O itself.
template <int D, int NT>
__device__ __forceinline__ void fold_values(WarpState<D, NT>& w) {
  constexpr int NDG = D / 32;
  const int c = threadIdx.x & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int dg = 0; dg < NDG; ++dg) {
      float z[2];
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) z[hc] = __shfl_sync(0xffffffffu, w.zacc[nt][hc], 4 * dg + c);
#pragma unroll
      for (int mh = 0; mh < 2; ++mh) {
        const float unit = static_cast<float>(1 << (24 - SlotMap<D>::pos(2 * dg + mh)));  // 2^(24 - pos)
#pragma unroll
        for (int e = 0; e < 4; ++e) w.acc[2 * dg + mh][nt][e] = w.acc[2 * dg + mh][nt][e] * unit + z[e & 1];
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) w.zacc[nt][e] = 0.f;
  }
}

// l summed over the lanes of each column.
template <int D, int NT>
__device__ __forceinline__ void finish_state(WarpState<D, NT>& w) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) {
      float l = w.l[nt][hc];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      w.l[nt][hc] = l;
    }
  }
}

}  // namespace oscar

#include "oscar_decode_impl.cuh"
