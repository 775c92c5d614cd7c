// OScaR append/pack: Hadamard rotation + token norm over all KV heads + INT2 quantization + packing.
//
// Semantics (quant.methods.oscar.pack_block; the rounding of quant.primitives.asym_quantize), per 32-token block:
//   K_rot = fwht(K) * rsqrtf(D)          (natural-order butterfly, stages h = 1, 2, .., D / 2 in that order, the
//                                         additions of fwht_rows / fwht_lanes: results are bit-identical to them)
//   n_t   = ||K[b, :, t, :]|| over all heads and channels (fp32 sum, sqrt_rn; n <= 0 -> 1), written to norms
//   keys:   y = K_rot / n_t (IEEE division), per channel over the 32 tokens: s = fp16(max(fp16((hi - lo) / 3),
//           2^-24)), z = fp16(lo) (integer zero point: fp16(-s * rint(-lo / s))), code = clamp(rint((y - z) / s), 0, 3)
//   values: per token over each 32 channels of V_rot, the same formula (V_rot = V when rotate_values is off: the
//           model's v_proj already carries the rotation, quant/fold.py)
// Codes are written in the "frag" order (oscar_layout.cuh, quant.packed.frag_pack) and value scales/zeros per
// block as [D/32][32] (quant.packed.frag_scales).
//
// One kernel, grid (T / 32, head chunks, B), 256 threads, 2 CTAs per SM (128 registers, ~105 KB shared each). A CTA
// owns one 32-token block of one batch row and a chunk of heads (every head for a long prefill: the norms need all
// of them, so no other CTA reads them):
//   phase 1 (token_norm only): the CTA streams K of ALL heads of its 32 tokens (16-byte loads, 8 per thread in
//           flight, 8 threads per token) and reduces the sums of squares to n_t and RN(1/n_t) in shared memory;
//   phase 2: "units" (one head's K or V block, 32 tokens x D) run on slots of D / 2 threads (4 slots for D = 128,
//           8 for D = 64); every thread owns 64 elements of its unit in registers. A slot's next unit is fetched with
//           cp.async (16 bytes, this thread's own chunks: no barrier) into a second stage while it computes the
//           current one. K is read a second time here: those loads hit L2 (the CTA read the same 8 KB per head
//           moments before; heads run last-read-first). (An L2 evict-first hint on V, `cp.async...L2::cache_hint`, raised
//           "illegal instruction" on the H100 in multi-round CTAs: dropped.)
// K-resident schedule (`kResident`; long prefills with heads == 2 slots, e.g. 8 heads of 128, aligned inputs, token
// norm on): the CTA's 2 x 4 stages hold K of all its heads at once, so phase 1 sums the norms from shared memory and K
// is read from DRAM once, in one burst, instead of a register pass plus an L2 re-read; rounds K, K, V, V per slot, each
// V fetched one round ahead. Same arithmetic in the same order, so the same bits (tests/kernels/test_csrc.py); faster
// at long prefills (docs/PERFORMANCE.md, "Design choices in the kernel code"). Build flag OSCAR_PACK_RESIDENT=0 turns
// it off.
// Both units load and rotate in the "row layout" (a thread holds 64 channels of one token: 6 of the 7 butterfly
// stages in registers, one shuffle stage for D = 128). Values stay there: a 32-channel group's min/max is in
// registers (+ one shuffle) and each 16-bit half of a frag word is the thread's own 8 codes. Keys go through a
// shared fp32 tile into the "key layout" (a thread holds 8 channels of 8 tokens): per-channel min/max over tokens
// is mostly in registers and the thread's 8 channels' parameters fit in 24 registers. Codes are assembled from the
// bits of (code + 1.5 * 2^23) with shifts/adds, then (keys) a 1-2 step shuffle reduce-scatter: no byte staging.
// Divisions by s, n_t and 3 are the exact IEEE quotient from a precomputed correctly rounded reciprocal and one fma
// correction (Markstein); see div_rn / qbits for the CPU checks that back this.
//
// Cost: the hot path's instructions per element stay under the issue budget of streaming at half the copy bandwidth
// (the counts: docs/PERFORMANCE.md, Pack). Whole-kernel logic checked on the CPU: this file compiled for the host with the inline-asm helpers
// (cp.async, fma.sat, bar.sync) and warp shuffles emulated (one std::thread per CUDA thread), outputs
// bit-equal to a float32 numpy model of the semantics above for D = 64 / 128, fp16 / bf16 / fp32 inputs, aligned and
// unaligned strides, 1..32 heads, split and whole-head grids, constant groups, zero tokens, fp16-overflowing zeros.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "oscar_common.cuh"
#include "oscar_layout.cuh"

namespace oscar {

struct PackParams {
  const void* k;  // [B, H, T, D] dtype T, strides (elements) below, last dim contiguous
  const void* v;
  int64_t k_sb, k_sh, k_st, v_sb, v_sh, v_st;
  int32_t* kc;  // [B, H, T/16, D]
  __half* ks;   // [B, H, T/32, D]
  __half* kz;
  int32_t* vc;  // [B, H, T, D/16]
  __half* vs;   // [B, H, T, D/32]
  __half* vz;
  float* norms;  // [B, T]
  int heads, tokens;
  bool rotate, token_norm;
  bool rotate_values;  // false: the values arrive rotated (OScaR's V Hadamard folded into v_proj / o_proj), keys only
  bool integer_zero;   // the integer zero point's offset instead of the float minimum (group_params)
};

constexpr float kMinScale = 5.9604644775390625e-8f;  // quant.primitives.MIN_SCALE = 2**-24, the smallest positive fp16

// asym_quantize for one group given its min/max; returns the code of x. The reference definition: the kernel
// computes the same code through qbits() below (proved equal there).
__device__ __forceinline__ uint32_t quant_code(float x, float s, float z) {
  if (s <= 0.f) return 0u;  // the fp16 scale underflowed: a (near-)constant group, code 0 is its value
  const float q = rintf(__fdiv_rn(x - z, s));
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.f), 3.f));
}

namespace pack {

constexpr int kPackThreads = 256;
constexpr uint32_t kMagicBits = 0x4B400000u;  // bits of 12582912.f = 1.5 * 2^23; c + 12582912.f holds rint(c) in its low bits

template <int D, typename T>
struct Geo {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kUnit = D / 2;                   // threads of one unit (64 elements each)
  static constexpr int kSlots = kPackThreads / kUnit;   // units in flight per CTA: 4 (D = 128) or 8 (D = 64)
  static constexpr int kRow = D / 8;                    // lanes holding one key row in the key layout
  static constexpr int kUnitWarps = kUnit / 32;         // 2 or 1
  static constexpr int kChunk = 8 * static_cast<int>(sizeof(T));  // bytes of 8 elements
  static constexpr int kStage = 8 * kUnit * kChunk;     // one unit's block as loaded: 32 tokens x D x sizeof(T)
  static constexpr int kTile = 32 * D * 4;              // one unit's block in fp32 (the keys' transpose)
  static constexpr int kRed = 2 * kUnitWarps * D;       // floats: per-warp channel lo / hi of a key unit
  static constexpr int kPar = 3 * D;                    // floats: z, 1/(4 s), 4 s per channel of a key unit
  // Per slot: [stage 0][extra][stage 1][red]. Round k reads stage k & 1 while round k + 1's copies land in the other;
  // a key unit's transpose tile (kTile bytes) starts at (k & 1) kStage: stage 0 + extra or extra + stage 1, never the
  // other stage. The parameters live at the start of extra, which no copy ever writes.
  static constexpr int kXtra = kTile - kStage > 4 * kPar ? kTile - kStage : 4 * kPar;
  static constexpr int kSlotBytes = 2 * kStage + kXtra + 4 * kRed;
  static constexpr int kSmem = kSlots * kSlotBytes + 2 * 32 * 4;  // + token norms and their reciprocals
};

// ---- exact division helpers -------------------------------------------------------------------------------
// div_rn(a, b, r) with r = RN(1/b): q0 = RN(a r), rem = a - b q0 (exact in an fma), RN(q0 + rem r) = RN(a / b)
// (Markstein's correction step). Checked on the CPU (IEEE fmaf, float division rounded from double, which is
// correctly rounded for a float quotient):
//   - b any positive finite fp16 (the scales, 31743 values incl. subnormals), a every float within 64 ulps of
//     b * {0.5, 1.5, 2.5} (the rounding boundaries of the codes): 12.3 M cases, 0 mismatches, and 635 M random a
//     with a / b in [2^-20, 2^20]: 0 mismatches; so codes from div_rn equal codes from __fdiv_rn for every a
//     (away from the boundaries any approximation within a few ulps gives the same code);
//   - b = 3 (the scale formula, r = RN(1/3)): all 2^32 floats a: equal except a = -0 (-> +0, and the scale then
//     takes max(., 2^-24) either way);
//   - b a token norm: 10^9 random (a, b) with b in [2^-64, 2^64], |a| >= 2^-96: 0 mismatches; tiny |a| (the
//     remainder underflows) are sent to __fdiv_rn by the caller.
__device__ __forceinline__ float div_rn(float a, float b, float r) {
  const float q0 = __fmul_rn(a, r);
  return fmaf(fmaf(-b, q0, a), r, q0);
}

// __fdiv_rn(d, 3.f) for every d (inf / NaN pass through as the IEEE quotient does; -0 gives +0, see above).
__device__ __forceinline__ float div3_rn(float d) {
  const float q = div_rn(d, 3.f, 0.3333333432674407958984375f);  // RN(1/3) = 0x3EAAAAAB
  return fabsf(d) <= FLT_MAX ? q : d;
}

// Scale and zero of one quantization group from its min/max, exactly as asym_quantize (fp16 rounding twice, the
// MIN_SCALE clamp), plus what qbits needs as floats: z, r4 = RN(1/s) / 4 and s4 = 4 s (exact power-of-2 scalings).
// integer_zero: the zero is the offset fp16(-s * rint(-lo / s)) of an integer zero point (quant.primitives.integer_zero:
// the IEEE quotient, ties to even, one rounded product), and the codes clamp(rint((x - z) / s), 0, 3) as for a float one.
__device__ __forceinline__ void group_params(float lo, float hi, __half& hs, __half& hz, float& z, float& r4, float& s4,
                                             bool integer_zero) {
  hs = __float2half_rn(fmaxf(__half2float(__float2half_rn(div3_rn(__fsub_rn(hi, lo)))), kMinScale));
  const float s = __half2float(hs);
  hz = integer_zero ? __float2half_rn(__fmul_rn(-s, rintf(__fdiv_rn(-lo, s)))) : __float2half_rn(lo);
  z = __half2float(hz);
  r4 = 0.25f * __frcp_rn(s), s4 = 4.f * s;  // s >= 2^-24: 1/s <= 2^24; s = inf: r4 = 0 (every code 0, see qbits)
  // z = -inf with a finite s (lo < -65520): the reference's (x - z) / s = +inf -> code 3 for every non-NaN x. These
  // stand-ins give a = RN(x + FLT_MAX) = FLT_MAX (|x| < 2^17 since s is finite), q0 = FLT_MAX / 4, rem = FLT_MAX,
  // sat(FLT_MAX / 2) = 1 -> 4 -> 3; a NaN x stays NaN -> 0.
  if (z == -INFINITY && s != INFINITY) z = -FLT_MAX, r4 = 0.25f, s4 = 0.f;
}

// quant_code(x, s, z) as the bits of (code + 12582912.f): low 2 bits = the code, the rest kMagicBits.
//   q0 = RN(a r) / 4, rem = a - s q0 (exact), sat(RN(q0 + rem r) / 4) = clamp(RN(a / s), 0, 4) / 4: div_rn's
//   quotient scaled by the exact 2^-2 (the fma rounds (rem r + q0) / 4 once; below 2^-124, where the scaling is
//   inexact, the code is 0 either way); fma.sat clamps to [0, 1] and sends NaN to 0 (fmaxf(NaN, 0) = 0 in
//   quant_code too); RN(4 qs + 1.5 * 2^23) = 1.5 * 2^23 + rint(4 qs) with ties to even (the ulp there is 1), and
//   min(rint(clamp(q, 0, 4)), 3) = clamp(rint(q), 0, 3) (integer bounds, rint monotone).
// s = inf: r4 = 0, q0 = 0 or NaN, rem = NaN -> 0 = the reference's a / inf = 0 or inf / inf = NaN -> 0. z = +inf:
// a = -inf or NaN -> 0 in both. s <= 0 never reaches here (s >= 2^-24, or the stand-in above).
// CPU check of this exact sequence against clamp(rint(a / s)) (IEEE fmaf, quotient from double): every positive
// fp16 s, a within 64 ulps of s * {0.5, 1.5, 2.5, 3.5} and 2000 random a per s, and 2e8 random (x, z, s) with
// a = RN(x - z): 2.8e8 cases, 0 mismatches.
__device__ __forceinline__ float fma_sat(float a, float b, float c) {  // saturate(RN(a b + c)) to [0, 1], NaN -> 0
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

__device__ __forceinline__ uint32_t qbits(float x, float z, float r4, float s4) {
  const float a = __fsub_rn(x, z);
  const float q0 = __fmul_rn(a, r4);
  const float qs = fma_sat(fmaf(-s4, q0, a), r4, q0);
  return min(__float_as_uint(fmaf(qs, 4.f, 12582912.f)), kMagicBits + 3u);
}

// ---- data movement ----------------------------------------------------------------------------------------
__device__ __forceinline__ void to_floats(uint4 w, float (&x)[8], const __nv_bfloat16*) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) x[2 * i] = __uint_as_float(u[i] << 16), x[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
}
__device__ __forceinline__ void to_floats(uint4 w, float (&x)[8], const __half*) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(as_half2(u[i]));
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
}

// 8 elements (one chunk) from shared memory (the stage layout written by fetch_chunk).
template <typename T>
__device__ __forceinline__ void smem_chunk(const unsigned char* src, float (&x)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 16);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    to_floats(*reinterpret_cast<const uint4*>(src), x, static_cast<const T*>(nullptr));
  }
}

// 8 elements from global memory (phase 1); kVec: 16-byte aligned.
template <typename T, bool kVec>
__device__ __forceinline__ void global_chunk(const T* src, float (&x)[8]) {
  if constexpr (!kVec) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = to_float(src[i]);
  } else if constexpr (sizeof(T) == 4) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src)), b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    to_floats(__ldg(reinterpret_cast<const uint4*>(src)), x, static_cast<const T*>(nullptr));
  }
}

template <int kId, int kCount>
__device__ __forceinline__ void named_barrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// One chunk global -> shared: cp.async (kVec) or plain loads and a shared store (unaligned inputs).
template <typename T, bool kVec>
__device__ __forceinline__ void fetch_chunk(unsigned char* dst, const T* src) {
  if constexpr (kVec) {
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(T)) / 2; ++i) {
      cp_async16(smem_addr(dst + 16 * i), src + 16 / sizeof(T) * i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) reinterpret_cast<T*>(dst)[i] = src[i];
  }
}

// ---- butterflies --------------------------------------------------------------------------------------------
// Channel bits 0..2 of a chunk in registers: fwht8 (oscar_common.cuh).

// One stage across lanes (partner = lane ^ m): the lower lane (sgn = 1) gets a + b = fma(1, a, b), the upper
// (sgn = -1) a - b = fma(-1, b, a), both exact one-rounding sums like fwht_rows' a + b and a - b.
__device__ __forceinline__ void fwht_lane_stage(float (&x)[8], int m, float sgn) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = fmaf(sgn, x[i], __shfl_xor_sync(0xffffffffu, x[i], m));
}

// One stage across two register chunks (a the lower channel block, b the upper).
__device__ __forceinline__ void fwht_pair(float (&a)[8], float (&b)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float u = a[i], w = b[i];
    a[i] = u + w, b[i] = u - w;
  }
}

template <int D>
__device__ __forceinline__ void unit_sync(int slot) {
  if constexpr (D == 64) {
    __syncwarp();  // a D = 64 unit is one warp
  } else {
    switch (slot) {  // the slot's two warps; immediate ids keep ptxas from reserving all 16 barriers
      case 0: named_barrier<1, D / 2>(); break;
      case 1: named_barrier<2, D / 2>(); break;
      case 2: named_barrier<3, D / 2>(); break;
      default: named_barrier<4, D / 2>(); break;
    }
  }
}

// ---- row layout: loading and rotating ------------------------------------------------------------------------
// Both units load and rotate in the "row layout": D = 128: thread u = 32 w + lane holds token 16 w + (lane >> 1),
// register slot x (0..7) = chunk (lane & 1) + 2 x (channel bit 3 = lane bit 0, channel bits 4..6 = x); D = 64:
// thread u holds token u, slot x = chunk (x >> 2) + 2 (x & 3) (channel bits 3, 4, 5 = x bits 2, 0, 1). Six of the
// seven (D = 128) or all six (D = 64) butterfly stages are then in registers.
template <int D>
__host__ __device__ constexpr int row_chunk(int lane_bit0, int x) { return D == 128 ? lane_bit0 + 2 * x : (x >> 2) + 2 * (x & 3); }
template <int D>
__device__ __forceinline__ int row_token(int u) { return D == 128 ? 16 * (u >> 5) + ((threadIdx.x & 31) >> 1) : u; }

// This thread's row-layout block from its stage (written by fetch_chunk: slot x of unit thread u at
// (x * kUnit + u) * kChunk), rotated: x = fwht(row) * rsqrt(D), stages in the order h = 1, 2, .., D / 2.
template <int D, typename T>
__device__ __forceinline__ void row_rotate(const unsigned char* stage, int u, bool rotate, float (&x)[8][8]) {
  using G = Geo<D, T>;
#pragma unroll
  for (int s = 0; s < 8; ++s) smem_chunk<T>(stage + (s * G::kUnit + u) * G::kChunk, x[s]);
  if (!rotate) return;
#pragma unroll
  for (int s = 0; s < 8; ++s) fwht8(x[s]);  // channel bits 0, 1, 2
  if constexpr (D == 128) {
    const float sgn = (threadIdx.x & 1) ? -1.f : 1.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) fwht_lane_stage(x[s], 1, sgn);  // channel bit 3
#pragma unroll
    for (int h = 1; h < 8; h <<= 1)  // channel bits 4, 5, 6 = slot bits 0, 1, 2
#pragma unroll
      for (int s = 0; s < 8; ++s)
        if (!(s & h)) fwht_pair(x[s], x[s + h]);
  } else {
    constexpr int kSlotBit[3] = {4, 1, 2};  // channel bits 3, 4, 5 = slot bits 2, 0, 1
#pragma unroll
    for (int st = 0; st < 3; ++st)
#pragma unroll
      for (int s = 0; s < 8; ++s)
        if (!(s & kSlotBit[st])) fwht_pair(x[s], x[s + kSlotBit[st]]);
  }
  const float inv = rsqrtf(static_cast<float>(D));
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int i = 0; i < 8; ++i) x[s][i] = __fmul_rn(x[s][i], inv);
}

// ---- key unit -----------------------------------------------------------------------------------------------
// Rotated (and norm-divided) in the row layout, a key block goes through a shared fp32 tile [32 tokens][D] into
// the "key layout": thread u holds chunk j = u % (D/8) (channels 8j..8j+7) of 8 tokens, row id q = u / (D/8)
// (0..3): register row kk (0..7) is token key_token(q, kk) = 8 (kk >> 1) + 2 (kk & 1) + 4 (q >> 1) + (q & 1) (bits
// 0, 2 of the token from q, bit 1 from kk & 1, bits 3..4 from kk >> 1: the 4 row ids x 8 rows cover the 32 tokens
// once, and rows 2k, 2k + 1 are the token pair (t, t + 2) that shares frag words). Per-channel min/max over the
// tokens is then mostly in registers, and the 24 quantization parameters of the thread's 8 channels fit there too.
__host__ __device__ constexpr int key_token(int q, int kk) { return 8 * (kk >> 1) + 2 * (kk & 1) + 4 * (q >> 1) + (q & 1); }

// The tile's 16-byte unit u (= 2 chunk + half) of token t sits at tile_unit(t, u) = u ^ (bit 3 of u) ^ tile_swz(t)
// (bits 0..2 only change: a bijection on the row's units). Row layout writes (one slot and half per instruction; the
// 8 lanes of a 16-byte phase = 4 tokens x 2 chunks for D = 128, 8 tokens for D = 64) and key layout reads (8 lanes =
// 8 chunks of one token) then hit 8 different 16-byte bank groups: bits 0..2 of the unit become (half ^ chunk bit 2
// ^ t0, chunk bit 0 ^ t2, chunk bit 1 ^ t1) (checked for both head dims in Python).
__host__ __device__ constexpr int tile_swz(int t) { return (t & 1) | (((t >> 2) & 1) << 1) | (((t >> 1) & 1) << 2); }
__host__ __device__ constexpr int tile_unit(int t, int unit) { return unit ^ ((unit >> 3) & 1) ^ tile_swz(t); }

// Frag word (0 .. 2D-1 within the block) that lane (q, j) stores for token pair k (tokens t, t + 2 with
// t = key_token(q, 2k)). Derivation (frag_slot, keys): word W = 128 (w >> 2) + 4 (4 g + c) + (w & 3) holds token
// frag_token(tile, g + 8 (r & 1)) = 8 (g >> 1) + 4 tile + 2 (r & 1) + (g & 1) and, in field 8 h + s, channel
// frag_channel(...). D = 128 (8 words per lane, f = 8 w + s, r = w & 3, tile = w >> 2, x = s): the word is ONE
// token, channels 32 a + 8 c + 4 b + 2 e + h (e = r >> 1) at field 8 h + 2 a + b; the thread with chunk j = c + 4 a
// holds its 4 codes (b, h) for each e. After the 2-step reduce-scatter over a (lanes ^4, ^8), lane a = j >> 2 keeps
// token t + 2 (a & 1), e = a >> 1: W = 128 tile + 16 g + 4 c + 2 e + (r & 1) = base(t) + 4 (j & 3) + (j >> 2).
// D = 64 (4 words per lane, q' = 2 w + (s >> 2), x = s & 3): the word is the token pair (t, t + 2) (field bit 2),
// channels 32 (x >> 1) + 8 c + 4 (x & 1) + 2 e + h with e = w & 1; after one reduce step over a = j >> 2 (lane ^4),
// lane a keeps e = a: W = 16 g + 4 c + 2 tile + e. Checked against quant.packed.frag_slots (every token and channel,
// both head dims) by mirroring these formulas in Python.
template <int D>
__host__ __device__ constexpr int key_word(int q, int k, int j) {
  return D == 128 ? 128 * (q >> 1) + 32 * k + 16 * (q & 1) + 4 * (j & 3) + (j >> 2)
                  : 16 * (2 * k + (q & 1)) + 4 * (j & 3) + 2 * (q >> 1) + (j >> 2);
}

// tile: this round's transpose tile (kTile bytes, overlapping the stage just read); red, par: the slot's lo/hi and
// parameter arrays.
template <int D, typename T>
__device__ __forceinline__ void key_unit(const PackParams& p, const unsigned char* stage, float* tile, int u, int slot,
                                         int64_t bh, int grp, float* red, float* par, const float* nrm, const float* nrcp) {
  using G = Geo<D, T>;
  const int lane = threadIdx.x & 31, wu = u >> 5;
  {
    float x[8][8];
    row_rotate<D, T>(stage, u, p.rotate, x);
    const int t = row_token<D>(u);
    if (p.token_norm) {
      const float n = nrm[t], rn = nrcp[t];
      bool slow = !(n >= 0x1p-64f && n <= 0x1p64f);
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int i = 0; i < 8; ++i) slow |= !(fabsf(x[s][i]) >= 0x1p-96f);  // zero, tiny, NaN
      if (slow) {  // outside div_rn's checked range: the IEEE division itself
#pragma unroll
        for (int s = 0; s < 8; ++s)
#pragma unroll
          for (int i = 0; i < 8; ++i) x[s][i] = __fdiv_rn(x[s][i], n);
      } else {
#pragma unroll
        for (int s = 0; s < 8; ++s)
#pragma unroll
          for (int i = 0; i < 8; ++i) x[s][i] = div_rn(x[s][i], n, rn);
      }
    }
    unit_sync<D>(slot);  // the whole unit has read its stage: the tile may overwrite it
    // Unit 2 row_chunk(r1, s) + h = U ^ 2 r1 with U = 2 row_chunk(0, s) + h (D = 128; D = 64 has no r1), so its place
    // is tile_unit(t, U) ^ 2 r1 = K ^ c with K = U ^ (bit 3 of U) known at compile time and c = tile_swz(t) ^ 2 r1:
    // 8 per-thread bases xb[v] = row + 16 (v ^ c) and the immediate 16 (K & ~7) address all 16 stores.
    const int c = tile_swz(t) ^ (D == 128 ? 2 * (lane & 1) : 0);
    unsigned char* row = reinterpret_cast<unsigned char*>(tile + t * D);
    unsigned char* xb[8];
#pragma unroll
    for (int v = 0; v < 8; ++v) xb[v] = row + 16 * (v ^ c);
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int uu = 2 * row_chunk<D>(0, s) + h, kw = uu ^ ((uu >> 3) & 1);
        *reinterpret_cast<float4*>(xb[kw & 7] + 16 * (kw & ~7)) =
            make_float4(x[s][4 * h], x[s][4 * h + 1], x[s][4 * h + 2], x[s][4 * h + 3]);
      }
    unit_sync<D>(slot);
  }
  // Key layout reads: token key_token(q, kk) = tq + 8 (kk >> 1) + 2 (kk & 1) with tq = 4 (q >> 1) + (q & 1), so
  // tile_swz(t) = (q & 3) | (kk & 1) << 2: 4 per-thread column bases (kk parity x half) and an immediate row offset.
  const int j = u % G::kRow, q = u / G::kRow;
  const unsigned char* col[2][2];
#pragma unroll
  for (int odd = 0; odd < 2; ++odd)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      col[odd][h] = reinterpret_cast<const unsigned char*>(tile + (4 * (q >> 1) + (q & 1)) * D) +
                    16 * ((2 * j + h) ^ ((j >> 2) & 1) ^ (q & 3) ^ (odd << 2));
  float x[8][8];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const int roff = (8 * (kk >> 1) + 2 * (kk & 1)) * D * 4;
    const float4 a = *reinterpret_cast<const float4*>(col[kk & 1][0] + roff);
    const float4 b = *reinterpret_cast<const float4*>(col[kk & 1][1] + roff);
    x[kk][0] = a.x, x[kk][1] = a.y, x[kk][2] = a.z, x[kk][3] = a.w, x[kk][4] = b.x, x[kk][5] = b.y, x[kk][6] = b.z, x[kk][7] = b.w;
  }

  // Per channel min/max over the 32 tokens: own 8 rows, then the row ids of this warp (shuffles), then the unit's
  // warps (D = 128: 2) through shared memory.
  float lo[8], hi[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    lo[i] = hi[i] = x[0][i];
#pragma unroll
    for (int kk = 1; kk < 8; ++kk) lo[i] = fminf(lo[i], x[kk][i]), hi[i] = fmaxf(hi[i], x[kk][i]);
  }
#pragma unroll
  for (int m = G::kRow; m < 32; m <<= 1)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo[i] = fminf(lo[i], __shfl_xor_sync(0xffffffffu, lo[i], m));
      hi[i] = fmaxf(hi[i], __shfl_xor_sync(0xffffffffu, hi[i], m));
    }
  if (lane < G::kRow) {  // red: [lo of warp 0.., hi of warp 0..][D]
    float4* rl = reinterpret_cast<float4*>(red + wu * D + 8 * j);
    float4* rh = reinterpret_cast<float4*>(red + (G::kUnitWarps + wu) * D + 8 * j);
    rl[0] = make_float4(lo[0], lo[1], lo[2], lo[3]), rl[1] = make_float4(lo[4], lo[5], lo[6], lo[7]);
    rh[0] = make_float4(hi[0], hi[1], hi[2], hi[3]), rh[1] = make_float4(hi[4], hi[5], hi[6], hi[7]);
  }
  unit_sync<D>(slot);  // also: every thread has read the tile
  {  // thread (q, j) finishes channels 8 j + 2 q, +1 (the 4 row ids of a chunk cover its 8 channels)
    const int ch = 8 * j + 2 * q;
    float2 l = *reinterpret_cast<const float2*>(red + ch), h = *reinterpret_cast<const float2*>(red + G::kUnitWarps * D + ch);
#pragma unroll
    for (int w = 1; w < G::kUnitWarps; ++w) {
      const float2 l2 = *reinterpret_cast<const float2*>(red + w * D + ch);
      const float2 h2 = *reinterpret_cast<const float2*>(red + (G::kUnitWarps + w) * D + ch);
      l.x = fminf(l.x, l2.x), l.y = fminf(l.y, l2.y), h.x = fmaxf(h.x, h2.x), h.y = fmaxf(h.y, h2.y);
    }
    __half s0, s1, z0, z1;
    float2 zf, rf, sf;
    group_params(l.x, h.x, s0, z0, zf.x, rf.x, sf.x, p.integer_zero);
    group_params(l.y, h.y, s1, z1, zf.y, rf.y, sf.y, p.integer_zero);
    const int64_t o = (bh * (p.tokens / kGroup) + grp) * D + ch;
    *reinterpret_cast<__half2*>(p.ks + o) = __halves2half2(s0, s1);
    *reinterpret_cast<__half2*>(p.kz + o) = __halves2half2(z0, z1);
    *reinterpret_cast<float2*>(par + ch) = zf;
    *reinterpret_cast<float2*>(par + D + ch) = rf;
    *reinterpret_cast<float2*>(par + 2 * D + ch) = sf;
  }
  unit_sync<D>(slot);
  float z[8], r[8], s[8];
  {
    const float4* pz = reinterpret_cast<const float4*>(par + 8 * j);
    const float4* pr = reinterpret_cast<const float4*>(par + D + 8 * j);
    const float4* ps = reinterpret_cast<const float4*>(par + 2 * D + 8 * j);
    const float4 z0 = pz[0], z1 = pz[1], r0 = pr[0], r1 = pr[1], s0 = ps[0], s1 = ps[1];
    z[0] = z0.x, z[1] = z0.y, z[2] = z0.z, z[3] = z0.w, z[4] = z1.x, z[5] = z1.y, z[6] = z1.z, z[7] = z1.w;
    r[0] = r0.x, r[1] = r0.y, r[2] = r0.z, r[3] = r0.w, r[4] = r1.x, r[5] = r1.y, r[6] = r1.z, r[7] = r1.w;
    s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w, s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
  }

  // Codes -> frag words. In-chunk channel i = 4 b + 2 e + h goes to field 8 h + 2 a + b (D = 128) or
  // 8 h + 4 rho + 2 a + b (D = 64, rho = which token of the pair): for each e the thread's 4 codes sit at bits
  // 2 b + 16 h, the token of the pair at + 8 rho (D = 64) and the chunk's a at + 4 a. The code bits are
  // kMagicBits + code: the sums below carry that constant along linearly (mod 2^32) and subtract it once.
  constexpr uint32_t kQuad = kMagicBits * (1u + 4u + 65536u + 262144u);
  const int a = j >> 2;
  int32_t* out = p.kc + (bh * (p.tokens / 16) + 2 * grp) * D;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t part[2][2];  // [token of the pair][e]
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t c[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = qbits(x[2 * k + m][i], z[i], r[i], s[i]);
#pragma unroll
      for (int e = 0; e < 2; ++e) part[m][e] = (c[2 * e] + (c[4 + 2 * e] << 2)) + ((c[2 * e + 1] + (c[5 + 2 * e] << 2)) << 16);
    }
    uint32_t word;
    if constexpr (D == 128) {
      // step 1 (lanes ^8 = a bit 1): keep e = a >> 1; step 2 (lanes ^4 = a bit 0): keep the token t + 2 (a & 1)
      const bool a1 = a >> 1, a0 = a & 1;
      uint32_t kept[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t p0 = (part[m][0] - kQuad) << (4 * a), p1 = (part[m][1] - kQuad) << (4 * a);
        kept[m] = (a1 ? p1 : p0) | __shfl_xor_sync(0xffffffffu, a1 ? p0 : p1, 8);
      }
      word = (a0 ? kept[1] : kept[0]) | __shfl_xor_sync(0xffffffffu, a0 ? kept[0] : kept[1], 4);
    } else {
      // both tokens of the pair in one word (bits + 8 rho); one step over a (lanes ^4): keep e = a
      const uint32_t p0 = (part[0][0] + (part[1][0] << 8) - kQuad * 257u) << (4 * a);
      const uint32_t p1 = (part[0][1] + (part[1][1] << 8) - kQuad * 257u) << (4 * a);
      word = (a ? p1 : p0) | __shfl_xor_sync(0xffffffffu, a ? p0 : p1, 4);
    }
    out[key_word<D>(q, k, j)] = static_cast<int32_t>(word);
  }
}

// ---- value unit ---------------------------------------------------------------------------------------------
// Row layout throughout. The code of slot x, in-chunk element g is field x of the 16-bit half (h = token & 1) of
// frag word g of the token pair: value words hold tokens 8 c + 4 tile + 2 e + h and channels 16 x' + g + 8 (r & 1)
// (D = 128: x' = s, r = w & 3 -> chunk (r & 1) + 2 s) or 16 (s & 3) + g + 8 (s >> 2 & 1) (D = 64: chunk
// 2 (s & 3) + (s >> 2 & 1), i.e. slot s). Checked against quant.packed.frag_slots in Python.
template <int D>
__host__ __device__ constexpr int value_group(int x) { return D == 128 ? x >> 1 : (x >> 1) & 1; }  // 32-channel group of slot x
// Word (within the block) of in-chunk element g for token t (and lane bit r1, D = 128).
template <int D>
__host__ __device__ constexpr int value_word(int t, int g, int r1) {
  return D == 128 ? 128 * ((t >> 2) & 1) + 16 * g + 4 * (t >> 3) + 2 * ((t >> 1) & 1) + r1 : 16 * g + 4 * (t >> 3) + ((t >> 1) & 3);
}

template <int D, typename T>
__device__ __forceinline__ void value_unit(const PackParams& p, const unsigned char* stage, int u, int64_t bh, int t0) {
  constexpr int kGroups = D / 32;
  const int lane = threadIdx.x & 31;
  const int t = row_token<D>(u), r1 = D == 128 ? lane & 1 : 0;
  float x[8][8];
  row_rotate<D, T>(stage, u, p.rotate_values, x);

  // min/max of each 32-channel group: 16 (D = 128, + the partner lane's 16) or 32 of the thread's elements
  float lo[kGroups], hi[kGroups];
#pragma unroll
  for (int cg = 0; cg < kGroups; ++cg) lo[cg] = hi[cg] = x[2 * cg][0];  // slot 2 cg is the group's first slot (both D)
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int i = 0; i < 8; ++i) lo[value_group<D>(s)] = fminf(lo[value_group<D>(s)], x[s][i]), hi[value_group<D>(s)] = fmaxf(hi[value_group<D>(s)], x[s][i]);

  float z[kGroups], r[kGroups], sc[kGroups];
  const int64_t sbase = (bh * p.tokens + t0) * (D / 32) + t;  // + 32 cg: per block [D/32][32]
  if constexpr (D == 128) {
#pragma unroll
    for (int cg = 0; cg < kGroups; ++cg) {
      lo[cg] = fminf(lo[cg], __shfl_xor_sync(0xffffffffu, lo[cg], 1));
      hi[cg] = fmaxf(hi[cg], __shfl_xor_sync(0xffffffffu, hi[cg], 1));
    }
    // lane r1 finishes groups 2 r1, 2 r1 + 1 and trades them with its partner
    float mz[2], mr[2], ms[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      __half hs, hz;
      group_params(r1 ? lo[2 + e] : lo[e], r1 ? hi[2 + e] : hi[e], hs, hz, mz[e], mr[e], ms[e], p.integer_zero);
      p.vs[sbase + 32 * (2 * r1 + e)] = hs;
      p.vz[sbase + 32 * (2 * r1 + e)] = hz;
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float oz = __shfl_xor_sync(0xffffffffu, mz[e], 1), orr = __shfl_xor_sync(0xffffffffu, mr[e], 1),
                  os = __shfl_xor_sync(0xffffffffu, ms[e], 1);
      z[e] = r1 ? oz : mz[e], r[e] = r1 ? orr : mr[e], sc[e] = r1 ? os : ms[e];
      z[2 + e] = r1 ? mz[e] : oz, r[2 + e] = r1 ? mr[e] : orr, sc[2 + e] = r1 ? ms[e] : os;
    }
  } else {
#pragma unroll
    for (int cg = 0; cg < kGroups; ++cg) {
      __half hs, hz;
      group_params(lo[cg], hi[cg], hs, hz, z[cg], r[cg], sc[cg], p.integer_zero);
      p.vs[sbase + 32 * cg] = hs;
      p.vz[sbase + 32 * cg] = hz;
    }
  }

  // Half-words: acc[g] = sum_x 4^x (kMagicBits + code(x, g)) - kMagicBits * 21845 = the 8 codes at bits 2x.
  uint32_t acc[8];
#pragma unroll
  for (int s = 7; s >= 0; --s)
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int cg = value_group<D>(s);
      const uint32_t c = qbits(x[s][g], z[cg], r[cg], sc[cg]);
      acc[g] = s == 7 ? c : (acc[g] << 2) + c;
    }
  // Word g of the token pair = (half of token 2m) | (half of token 2m + 1) << 16. The lane with h = t & 1 stores
  // words g = 4 h + k: X_k = acc[k] | acc[k + 4] << 16 trades with the partner (token t ^ 1: lane ^2 for D = 128,
  // ^1 for D = 64); h = 0 takes the low halves (own, partner's), h = 1 the high halves (partner's, own).
  constexpr uint32_t kHalf = kMagicBits * 21845u;
  const int h = t & 1;
  int32_t* out = p.vc + (bh * p.tokens + t0) * (D / 16);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t xk = (acc[k] - kHalf) | ((acc[k + 4] - kHalf) << 16);
    const uint32_t yk = __shfl_xor_sync(0xffffffffu, xk, D == 128 ? 2 : 1);
    out[value_word<D>(t, 4 * h + k, r1)] = static_cast<int32_t>(__byte_perm(xk, yk, h ? 0x3276 : 0x5410));
  }
}

// ---- the kernel ---------------------------------------------------------------------------------------------
// Phase-2 schedule: round k, slot s runs head h1 - 1 - (kSlots / 2) k - (s >> 1), K if (s + k) is even else V: slots
// 2m and 2m + 1 share a head, and every slot alternates K and V (keys cost more) across rounds.
// Phase 1's end: the 8 partial sums of token tt (lanes k8 = 0..7) -> n_t = sqrt (n <= 0 -> 1) and RN(1 / n_t) in
// shared memory, and n_t to out[tt] unless out is null (a CTA of a head chunk other than the first); a CTA barrier.
__device__ __forceinline__ void token_norm_finish(float acc, int tt, int k8, float* nrm, float* nrcp, float* out) {
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  if (k8 == 0) {
    float nt = __fsqrt_rn(acc);
    nt = nt > 0.f ? nt : 1.f;
    nrm[tt] = nt, nrcp[tt] = __frcp_rn(nt);
    if (out != nullptr) out[tt] = nt;
  }
  __syncthreads();
}

// Where the K-resident schedule keeps chunk j (8 channels) of token t of a head's block: the row-layout offset that
// fetch_chunk gives it (thread u = the one whose row_token is t and whose row_chunk for slot x is j).
template <int D, typename T>
__device__ __forceinline__ int resident_offset(int t, int j) {
  using G = Geo<D, T>;
  if constexpr (D == 128) {
    const int u = 32 * (t >> 4) + 2 * (t & 15) + (j & 1), x = j >> 1;
    return (x * G::kUnit + u) * G::kChunk;
  } else {
    const int x = 4 * (j & 1) + (j >> 1);
    return (x * G::kUnit + t) * G::kChunk;
  }
}

template <int D, typename T, bool kVec, bool kResident>
__global__ void __launch_bounds__(kPackThreads, 2) pack_kernel(const PackParams p, int heads_per_cta) {
  using G = Geo<D, T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int grp = blockIdx.x, b = blockIdx.z, t0 = kGroup * grp;
  const int h0 = blockIdx.y * heads_per_cta, h1 = min(p.heads, h0 + heads_per_cta);
  const int slot = threadIdx.x / G::kUnit, u = threadIdx.x % G::kUnit, lane = threadIdx.x & 31;
  unsigned char* slot_mem = smem + slot * G::kSlotBytes;
  float* red = reinterpret_cast<float*>(slot_mem + 2 * G::kStage + G::kXtra);
  float* par = reinterpret_cast<float*>(slot_mem + G::kStage);  // in "extra": no fetch ever writes there
  float* nrm = reinterpret_cast<float*>(smem + G::kSlots * G::kSlotBytes);
  float* nrcp = nrm + kGroup;
  const T* kb = static_cast<const T*>(p.k) + b * p.k_sb + t0 * p.k_st;
  const T* vb = static_cast<const T*>(p.v) + b * p.v_sb + t0 * p.v_st;
  const int rounds = (h1 - h0 + G::kSlots / 2 - 1) / (G::kSlots / 2);
  auto stage_of = [&](int k) { return slot_mem + (k & 1) * (G::kStage + G::kXtra); };
  // Round k, slot s: head h1 - 1 - (kSlots / 2) k - (s >> 1) (below h0: idle), last heads first: phase 1 read them
  // last, so their second read is the likeliest to hit L2 when many heads do not all fit (H = 32).
  auto unit_head = [&](int k) { return h1 - 1 - G::kSlots / 2 * k - (slot >> 1); };

  // This thread's 8 row-layout chunks of round k's unit (K or V) into stage k & 1.
  auto fetch = [&](int k) {
    const int head = unit_head(k);
    if (head < h0) return;
    const bool values = (slot + k) & 1;
    const T* src = values ? vb + head * p.v_sh + row_token<D>(u) * p.v_st : kb + head * p.k_sh + row_token<D>(u) * p.k_st;
    unsigned char* st = stage_of(k);
#pragma unroll
    for (int s = 0; s < 8; ++s)
      fetch_chunk<T, kVec>(st + (s * G::kUnit + u) * G::kChunk, src + 8 * row_chunk<D>(lane & 1, s));
  };

  if constexpr (kResident) {
    // K-resident schedule (every head of a long prefill in one CTA, heads == 2 kSlots, aligned inputs, token norm):
    // slot s holds K of heads 2s, 2s + 1 in its two stages, so K is read from DRAM once, by one burst of cp.async
    // (64 KB for 8 heads of 128), and the token norms are summed from shared memory in phase 1's order (same bits).
    // Rounds: K(2s), K(2s + 1), V(2s), V(2s + 1); each V block is fetched one round ahead into the stage the K
    // before it has released.
    auto fetch_unit = [&](int head, bool values, int stage) {
      const T* src = values ? vb + head * p.v_sh + row_token<D>(u) * p.v_st : kb + head * p.k_sh + row_token<D>(u) * p.k_st;
      unsigned char* st = slot_mem + stage * (G::kStage + G::kXtra);
#pragma unroll
      for (int x = 0; x < 8; ++x)
        fetch_chunk<T, true>(st + (x * G::kUnit + u) * G::kChunk, src + 8 * row_chunk<D>(lane & 1, x));
    };
    const int h0k = 2 * slot;
    fetch_unit(h0k, false, 0);
    fetch_unit(h0k + 1, false, 1);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();  // phase 1 reads every slot's stages
    {
      const int tt = threadIdx.x >> 3, k8 = threadIdx.x & 7, n = p.heads * (D / 64);
      float acc = 0.f;
      for (int i = 0; i < n; ++i) {  // chunk k8 + 8 i of the token's row of all heads, in phase 1's order
        const int head = D == 128 ? i >> 1 : i, j = D == 128 ? k8 + 8 * (i & 1) : k8;
        float y[8];
        smem_chunk<T>(smem + (head >> 1) * G::kSlotBytes + (head & 1) * (G::kStage + G::kXtra) +
                          resident_offset<D, T>(tt, j), y);
#pragma unroll
        for (int c = 0; c < 8; ++c) acc = fmaf(y[c], y[c], acc);
      }
      token_norm_finish(acc, tt, k8, nrm, nrcp, p.norms + static_cast<int64_t>(b) * p.tokens + t0);
    }
    const int64_t bh0 = static_cast<int64_t>(b) * p.heads + h0k;
    key_unit<D, T>(p, slot_mem, reinterpret_cast<float*>(slot_mem), u, slot, bh0, grp, red, par, nrm, nrcp);
    fetch_unit(h0k, true, 0);  // stage 0 and its tile are free: every thread of the unit passed key_unit's syncs
    cp_async_commit();
    key_unit<D, T>(p, stage_of(1), reinterpret_cast<float*>(slot_mem + G::kStage), u, slot, bh0 + 1, grp, red, par,
                   nrm, nrcp);
    fetch_unit(h0k + 1, true, 1);
    cp_async_commit();
    cp_async_wait<1>();
    value_unit<D, T>(p, slot_mem, u, bh0, t0);
    cp_async_wait<0>();
    value_unit<D, T>(p, stage_of(1), u, bh0 + 1, t0);
    return;
  }

  fetch(0);
  if constexpr (kVec) cp_async_commit();

  if (p.token_norm) {  // phase 1: thread (token tt, k8) sums chunks k8 + 8 i of the token's H * D / 8 chunks
    const int tt = threadIdx.x >> 3, k8 = threadIdx.x & 7, n = p.heads * (D / 64);
    const T* src = kb + tt * p.k_st;
    auto chunk_ptr = [&](int i) {  // chunk k8 + 8 i: head (k8 + 8 i) / (D / 8), chunk in row (k8 + 8 i) % (D / 8)
      return D == 128 ? src + (i >> 1) * p.k_sh + 8 * (k8 + 8 * (i & 1)) : src + i * p.k_sh + 8 * k8;
    };
    float acc = 0.f;
    int i = 0;
    for (; i + 8 <= n; i += 8) {  // 8 loads in flight per thread (32 KB per CTA)
      float y[8][8];
#pragma unroll
      for (int e = 0; e < 8; ++e) global_chunk<T, kVec>(chunk_ptr(i + e), y[e]);
#pragma unroll
      for (int e = 0; e < 8; ++e)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc = fmaf(y[e][c], y[e][c], acc);
    }
    for (; i + 4 <= n; i += 4) {
      float y[4][8];
#pragma unroll
      for (int e = 0; e < 4; ++e) global_chunk<T, kVec>(chunk_ptr(i + e), y[e]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc = fmaf(y[e][c], y[e][c], acc);
    }
    for (; i < n; ++i) {
      float y[8];
      global_chunk<T, kVec>(chunk_ptr(i), y);
#pragma unroll
      for (int c = 0; c < 8; ++c) acc = fmaf(y[c], y[c], acc);
    }
    token_norm_finish(acc, tt, k8, nrm, nrcp, blockIdx.y == 0 ? p.norms + static_cast<int64_t>(b) * p.tokens + t0 : nullptr);
  }

  for (int k = 0; k < rounds; ++k) {
    if (k + 1 < rounds) fetch(k + 1);
    if constexpr (kVec) {
      cp_async_commit();
      cp_async_wait<1>();  // round k's copies (this thread's own: no barrier needed)
    }
    const int head = unit_head(k);
    if (head < h0) continue;
    const int64_t bh = static_cast<int64_t>(b) * p.heads + head;
    const unsigned char* st = stage_of(k);
    if (((slot + k) & 1) == 0) {
      float* tile = reinterpret_cast<float*>(slot_mem + (k & 1) * G::kStage);  // stage 0 + extra, or extra + stage 1
      key_unit<D, T>(p, st, tile, u, slot, bh, grp, red, par, nrm, nrcp);
    } else {
      value_unit<D, T>(p, st, u, bh, t0);
    }
  }
}

static int sm_count() {  // static: its cache stays this build's (no STB_GNU_UNIQUE symbol)
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (!cached[dev]) {
    int n = 0;
    cached[dev] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0 ? n : 132;
  }
  return cached[dev];
}

// Grid plan: long prefills get one CTA per (block, batch row) taking every head (phase 1 then reads K once); with
// few blocks (a decode step's 128-token flush) the heads are split over CTAs (at least a full round of slots each)
// until ~2 CTAs per SM; each such CTA reads every head's K for the norms (L2 hits after the first).
// Returns the heads per CTA; *chunks = gridDim.y.
inline int plan_heads(int heads, int groups, int batch, int sms, int min_heads, int* chunks) {
  const int64_t ctas = static_cast<int64_t>(groups) * batch, want = 2LL * sms;
  int n = 1;
  if (ctas < want) n = static_cast<int>(std::min<int64_t>((heads + min_heads - 1) / min_heads, (want + ctas - 1) / ctas));
  const int per_cta = (heads + n - 1) / n;
  *chunks = (heads + per_cta - 1) / per_cta;
  return per_cta;
}

template <int D, typename T, bool kVec, bool kResident>
static bool configured[64] = {};  // per device; internal linkage (`static`), see decode_configured (oscar_combine.cuh)

template <int D, typename T, bool kVec, bool kResident>
cudaError_t launch_as(const PackParams& p, int batch, int chunks, int per_cta, cudaStream_t stream) {
  using G = Geo<D, T>;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !configured<D, T, kVec, kResident>[dev]) {
    auto* kernel = pack_kernel<D, T, kVec, kResident>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmem);
    if (e == cudaSuccess)  // two CTAs per SM need (nearly) all of the unified L1 / shared memory as shared
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) configured<D, T, kVec, kResident>[dev] = true;
  }
  pack_kernel<D, T, kVec, kResident><<<dim3(p.tokens / kGroup, chunks, batch), kPackThreads, G::kSmem, stream>>>(p, per_cta);
  return cudaGetLastError();
}

#ifndef OSCAR_PACK_RESIDENT
#define OSCAR_PACK_RESIDENT 1
#endif

template <int D, typename T, bool kVec>
cudaError_t launch(const PackParams& p, int batch, cudaStream_t stream) {
  using G = Geo<D, T>;
  int chunks = 1;
  const int per_cta = plan_heads(p.heads, p.tokens / kGroup, batch, sm_count(), G::kSlots / 2, &chunks);
  if constexpr (kVec) {  // every head in one CTA, one K block per stage: the K-resident schedule
    if (OSCAR_PACK_RESIDENT && chunks == 1 && p.token_norm && p.heads == 2 * G::kSlots)
      return launch_as<D, T, true, true>(p, batch, chunks, per_cta, stream);
  }
  return launch_as<D, T, kVec, false>(p, batch, chunks, per_cta, stream);
}

}  // namespace pack

template <int D, typename T>
cudaError_t launch_pack(const PackParams& p, int batch, cudaStream_t stream) {
  if (p.tokens % kGroup) return cudaErrorInvalidValue;
  if (p.tokens == 0 || batch == 0 || p.heads == 0) return cudaSuccess;
  // 16-byte vector loads / cp.async need 16-byte aligned rows: base pointers and every stride (D itself is fine).
  auto aligned = [](const void* ptr, int64_t sb, int64_t sh, int64_t st) {
    constexpr int64_t e = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && sb % e == 0 && sh % e == 0 && st % e == 0;
  };
  if (aligned(p.k, p.k_sb, p.k_sh, p.k_st) && aligned(p.v, p.v_sb, p.v_sh, p.v_st))
    return pack::launch<D, T, true>(p, batch, stream);
  return pack::launch<D, T, false>(p, batch, stream);
}

}  // namespace oscar
