// Shared device helpers for the OScaR kernels: tensor-core MMA, INT2 fragment extraction, reductions,
// and the in-shared-memory Walsh-Hadamard transform. No torch headers: raw pointers only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace oscar {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kGroup = 32;        // tokens per key scale group = channels per value group
constexpr int kMaxSplits = 1024;  // split-KV partials per (b, kv head), residual split included

// D = A(16x16, row) * B(16x8, col) + D; f16 inputs, f32 accumulators (mma.sync, sm_80+).
// Fragments (g = lane / 4, c = lane % 4): a[0] = (row g, k 2c..2c+1), a[1] = (row g+8, same k),
// a[2] = (row g, k 2c+8..2c+9), a[3] = (row g+8, k 2c+8..); b0 = (k 2c..2c+1, col g), b1 = (k 2c+8..,
// col g); d[0..1] = (row g, cols 2c..2c+1), d[2..3] = (row g+8, same cols).
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ __half2 as_half2(uint32_t x) { return *reinterpret_cast<__half2*>(&x); }
__device__ __forceinline__ uint32_t as_u32(__half2 x) { return *reinterpret_cast<uint32_t*>(&x); }

// Two 16-code words wa, wb (2 bits per code, code i at bits 2i). For this lane's position p = g
// (lane / 4) and 8 + g, gather both words' bytes so that after the shift bits 0-1 / 16-17 hold
// (wa[g], wb[g]) and bits 8-9 / 24-25 hold (wa[8+g], wb[8+g]). One PRMT + one shift per 4 codes.
__device__ __forceinline__ uint32_t gather_codes(uint32_t wa, uint32_t wb, uint32_t sel, uint32_t shift) {
  return __byte_perm(wa, wb, sel) >> shift;
}

__device__ __forceinline__ uint32_t gather_selector(int g) {
  const uint32_t q = g >> 2;
  return q | ((2 + q) << 4) | ((4 + q) << 8) | ((6 + q) << 12);
}

// Codes at bits 8-9 and 24-25 of u -> half2 (code * s + z), given s4 = 4 s and z4 = z - 4 s
// (fold_scale_zero). OR-ing a code into mantissa bits 8-9 of fp16 1.0 (0x3C00) gives 1 + code / 4
// exactly, so one LOP3 + one HFMA2 dequantize two codes: (1 + c / 4) * 4 s + (z - 4 s) = c s + z, with
// one rounding (the product never needs more than the fp16 result's precision of c s + z).
__device__ __forceinline__ uint32_t dequant2(uint32_t u, __half2 s4, __half2 z4) {
  return as_u32(__hfma2(as_half2((u & 0x03000300u) | 0x3C003C00u), s4, z4));
}

// Scales and zeros staged as (s4, z4) = (4 s, z - 4 s) for dequant2. Lanes [0, n) hold 8 scales,
// lanes [n, 2n) the 8 zeros of the same elements; each lane gets its partner's vector by shuffles.
__device__ __forceinline__ int4 fold_scale_zero(int4 mine, int n) {
  const int lane = threadIdx.x & 31;
  const int partner = lane < n ? lane + n : lane - n;
  int4 other;
  other.x = __shfl_sync(0xffffffffu, mine.x, partner & 31);
  other.y = __shfl_sync(0xffffffffu, mine.y, partner & 31);
  other.z = __shfl_sync(0xffffffffu, mine.z, partner & 31);
  other.w = __shfl_sync(0xffffffffu, mine.w, partner & 31);
  const __half2 four = __float2half2_rn(4.f);
  const __half2* m = reinterpret_cast<const __half2*>(&mine);
  const __half2* o = reinterpret_cast<const __half2*>(&other);
  int4 out;
  __half2* w = reinterpret_cast<__half2*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = lane < n ? __hmul2(m[j], four) : __hfma2(__hneg2(o[j]), four, m[j]);
  return out;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// In-place natural-order Walsh-Hadamard transform of `rows` rows of D floats (row stride `ld`) in
// shared memory, by the whole block: y = H_pm1 x (unnormalized). log2(D) butterfly stages.
template <int D>
__device__ void fwht_rows(float* x, int rows, int ld) {
  for (int h = 1; h < D; h <<= 1) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * (D / 2); idx += blockDim.x) {
      const int r = idx / (D / 2), j = idx % (D / 2);
      const int i = (j / h) * 2 * h + (j % h);
      const float a = x[r * ld + i], b = x[r * ld + i + h];
      x[r * ld + i] = a + b;
      x[r * ld + i + h] = a - b;
    }
  }
  __syncthreads();
}

}  // namespace oscar
