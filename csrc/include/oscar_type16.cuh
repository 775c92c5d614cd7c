// fp16 / bf16 helpers shared by the decode-time layer kernels (GEMV, RMSNorm, RoPE): a pair of 16-bit values in a
// 32-bit word to float2 and back, and float -> T rounded to nearest even (the rounding of torch's casts).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace oscar {

template <typename T>
struct Type16;
template <>
struct Type16<__nv_bfloat16> {
  using pair = __nv_bfloat162;
  static __device__ __forceinline__ float2 f2(uint32_t v) { return __bfloat1622float2(*reinterpret_cast<pair*>(&v)); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    pair p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&p);
  }
  static __device__ __forceinline__ __nv_bfloat16 round(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float f(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <>
struct Type16<__half> {
  using pair = __half2;
  static __device__ __forceinline__ float2 f2(uint32_t v) { return __half22float2(*reinterpret_cast<pair*>(&v)); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    pair p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&p);
  }
  static __device__ __forceinline__ __half round(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float f(__half v) { return __half2float(v); }
};

}  // namespace oscar
