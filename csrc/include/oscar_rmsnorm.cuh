// RMSNorm of rows of N fp16/bf16 values, the formula of transformers' Llama/Qwen RMSNorm (quant/kernels/triton_norm.py
// has the Triton version and the allow-list):
//   h = float(x);  r = rsqrt(sum(h^2) / N + eps);  out = T(float(T(h r)) * float(w))
// The normalized value is rounded to T before the weight multiplies it; a product of two 16-bit floats is exact in
// float32, so that one multiply rounded once is torch's result for the step. The sum of squares is float32 in this
// kernel's order (torch's differs): results are within transformers' own error against float64, not bit for bit.
//
// Why a CUDA kernel beside the Triton one: a Qwen3-8B decode step calls the norm 145 times, and in eager decoding
// Triton's Python launcher costs more than the kernel. This launch is one C++ call.
//
// Layout: TPR threads per row (a power of two, 1..256), each holding CHUNKS 16-byte chunks (8 values) of the row in
// registers: 256 / TPR rows per CTA. Rows are 16-byte aligned with N % 8 == 0 (the binding checks; other inputs go to
// the Triton kernel).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "oscar_type16.cuh"

namespace oscar {

struct NormParams {
  const void* x;    // [rows, n], rows x_stride elements apart
  const void* w;    // [n]
  void* out;        // [rows, n] contiguous
  int64_t rows, x_stride;
  int n;            // % 8 == 0, <= 8 * 8 * 256
  float eps;
};

constexpr int kNormThreads = 256;
constexpr int kNormMaxN = 8 * 8 * kNormThreads;

template <typename T, int TPR, int CHUNKS>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const NormParams p) {
  constexpr int kRows = kNormThreads / TPR;
  constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
  __shared__ float warp_sums[kNormThreads / 32];
  const int sub = threadIdx.x / TPR, t = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + sub;
  const bool live = row < p.rows;
  const int chunks = p.n / 8;
  const uint4* xr = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + (live ? row : 0) * p.x_stride);
  const uint4* wr = reinterpret_cast<const uint4*>(p.w);
  uint4 wv[CHUNKS];  // the weight is loaded with x, before the reduction, so its latency is not added after it
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) wv[i] = t + i * TPR < chunks ? __ldg(wr + t + i * TPR) : make_uint4(0, 0, 0, 0);
  float h[CHUNKS][8];
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int c = t + i * TPR;
    const uint4 v = live && c < chunks ? __ldg(xr + c) : make_uint4(0, 0, 0, 0);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = Type16<T>::f2(u[e]);
      h[i][2 * e] = f.x, h[i][2 * e + 1] = f.y;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(h[i][e], h[i][e], acc);
  }
  // Sum over the row's TPR threads: lanes first (the row's lanes are an aligned group of the warp), then its warps.
#pragma unroll
  for (int m = (TPR < 32 ? TPR : 32) / 2; m >= 1; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if constexpr (kWarpsPerRow > 1) {
    const int warp = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) warp_sums[warp] = acc;
    __syncthreads();
    acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerRow; ++w) acc += warp_sums[sub * kWarpsPerRow + w];
  }
  if (!live) return;
  const float r = rsqrtf(__fdiv_rn(acc, static_cast<float>(p.n)) + p.eps);
  uint4* out = reinterpret_cast<uint4*>(static_cast<T*>(p.out) + row * p.n);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int c = t + i * TPR;
    if (c >= chunks) break;
    const uint32_t wu[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 wf = Type16<T>::f2(wu[e]);
      const float a = Type16<T>::f(Type16<T>::round(__fmul_rn(h[i][2 * e], r)));
      const float b = Type16<T>::f(Type16<T>::round(__fmul_rn(h[i][2 * e + 1], r)));
      o[e] = Type16<T>::pack(__fmul_rn(a, wf.x), __fmul_rn(b, wf.y));
    }
    out[c] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

template <typename T, int TPR, int CHUNKS>
cudaError_t launch_rms_norm_as(const NormParams& p, cudaStream_t stream) {
  constexpr int64_t kRows = kNormThreads / TPR;
  rms_norm_kernel<T, TPR, CHUNKS><<<static_cast<unsigned>((p.rows + kRows - 1) / kRows), kNormThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// A row's chunks spread over up to 256 threads (the smallest power of two >= the chunk count), at most 8 each.
template <typename T>
cudaError_t launch_rms_norm(const NormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.n <= 0 || p.n % 8 || p.n > kNormMaxN) return cudaErrorInvalidValue;
  const int chunks = p.n / 8;
  if (chunks <= 1) return launch_rms_norm_as<T, 1, 1>(p, stream);
  if (chunks <= 2) return launch_rms_norm_as<T, 2, 1>(p, stream);
  if (chunks <= 4) return launch_rms_norm_as<T, 4, 1>(p, stream);
  if (chunks <= 8) return launch_rms_norm_as<T, 8, 1>(p, stream);
  if (chunks <= 16) return launch_rms_norm_as<T, 16, 1>(p, stream);  // head_dim 128 (q_norm, k_norm)
  if (chunks <= 32) return launch_rms_norm_as<T, 32, 1>(p, stream);
  if (chunks <= 64) return launch_rms_norm_as<T, 64, 1>(p, stream);
  if (chunks <= 128) return launch_rms_norm_as<T, 128, 1>(p, stream);
  if (chunks <= 256) return launch_rms_norm_as<T, 256, 1>(p, stream);
  if (chunks <= 512) return launch_rms_norm_as<T, 256, 2>(p, stream);  // hidden 4096
  if (chunks <= 1024) return launch_rms_norm_as<T, 256, 4>(p, stream);
  return launch_rms_norm_as<T, 256, 8>(p, stream);
}

}  // namespace oscar
