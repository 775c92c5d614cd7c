// Rotary position embedding of q and k, the formula of transformers' apply_rotary_pos_emb (the allow-list and the
// Triton version are in quant/kernels/triton_rope.py):
//   out = q * cos + rotate_half(q) * sin,  rotate_half(x)[d] = -x[d + D/2] (d < D/2), x[d - D/2] (d >= D/2)
// with torch's rounding: each product rounded to T, then their sum (a product of two 16-bit floats is exact in
// float32, so float32 math with one rounding per op gives transformers' bits).
//
// A thread item is 4 channels d..d+3 of one head together with their partners d + D/2 (8-byte loads: D % 8 == 0,
// strides % 4 == 0, 8-byte aligned bases; the binding checks, and quant/kernels/cuda/layers.py sends anything else to the
// Triton kernel). Grid (B * L, CTAs of 128 items): each thread does one item, so its loads are one round trip (a
// decode step of 32 + 8 heads of 128 is 640 items in 5 CTAs; one CTA looping over them is slower: docs/PERFORMANCE.md,
// "Design choices in the kernel code").
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "oscar_type16.cuh"

namespace oscar {

struct RopeParams {
  const void* q;  // [B, Hq, L, D], strides in elements below, last dim contiguous
  const void* k;  // [B, Hk, L, D]
  const void* cos;  // [B or 1, L, D] (sc_b = 0 when shared by the batch)
  const void* sin;  // same strides as cos
  void* oq;
  void* ok;
  int length, hq, hk, d;
  int64_t sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, soq_b, soq_h, soq_l, sok_b, sok_h, sok_l, sc_b, sc_l;
};

constexpr int kRopeThreads = 128;

template <typename T>
__device__ __forceinline__ void rope_load4(const T* p, float (&v)[4]) {
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  const float2 a = Type16<T>::f2(w.x), b = Type16<T>::f2(w.y);
  v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

template <typename T>
__device__ __forceinline__ float rope_mul(float a, float b) {  // a product rounded to T, as a torch multiply
  return Type16<T>::f(Type16<T>::round(__fmul_rn(a, b)));
}

template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(const RopeParams p) {
  const int64_t b = blockIdx.x / p.length, pos = blockIdx.x % p.length;
  const int half = p.d / 2, quads = half / 4, items = (p.hq + p.hk) * quads;
  const T* cb = static_cast<const T*>(p.cos) + b * p.sc_b + pos * p.sc_l;
  const T* sb = static_cast<const T*>(p.sin) + b * p.sc_b + pos * p.sc_l;
  const int i = blockIdx.y * kRopeThreads + threadIdx.x;
  if (i < items) {
    int h = i / quads;
    const int d = 4 * (i - h * quads);
    const T* x;
    T* o;
    if (h < p.hq) {
      x = static_cast<const T*>(p.q) + b * p.sq_b + h * p.sq_h + pos * p.sq_l;
      o = static_cast<T*>(p.oq) + b * p.soq_b + h * p.soq_h + pos * p.soq_l;
    } else {
      h -= p.hq;
      x = static_cast<const T*>(p.k) + b * p.sk_b + h * p.sk_h + pos * p.sk_l;
      o = static_cast<T*>(p.ok) + b * p.sok_b + h * p.sok_h + pos * p.sok_l;
    }
    float lo[4], hi[4], c_lo[4], c_hi[4], s_lo[4], s_hi[4];
    rope_load4(x + d, lo), rope_load4(x + half + d, hi);
    rope_load4(cb + d, c_lo), rope_load4(cb + half + d, c_hi);
    rope_load4(sb + d, s_lo), rope_load4(sb + half + d, s_hi);
    float out_lo[4], out_hi[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      out_lo[e] = __fadd_rn(rope_mul<T>(lo[e], c_lo[e]), rope_mul<T>(-hi[e], s_lo[e]));
      out_hi[e] = __fadd_rn(rope_mul<T>(hi[e], c_hi[e]), rope_mul<T>(lo[e], s_hi[e]));
    }
    *reinterpret_cast<uint2*>(o + d) = make_uint2(Type16<T>::pack(out_lo[0], out_lo[1]), Type16<T>::pack(out_lo[2], out_lo[3]));
    *reinterpret_cast<uint2*>(o + half + d) =
        make_uint2(Type16<T>::pack(out_hi[0], out_hi[1]), Type16<T>::pack(out_hi[2], out_hi[3]));
  }
}

template <typename T>
cudaError_t launch_rope(const RopeParams& p, int64_t batch, cudaStream_t stream) {
  if (batch == 0 || p.length == 0 || p.hq + p.hk == 0) return cudaSuccess;
  if (p.d % 8) return cudaErrorInvalidValue;
  const int items = (p.hq + p.hk) * (p.d / 8);
  const dim3 grid(static_cast<unsigned>(batch * p.length), static_cast<unsigned>((items + kRopeThreads - 1) / kRopeThreads));
  rope_kernel<T><<<grid, kRopeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oscar
