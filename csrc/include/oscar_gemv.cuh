// Decode-time linear layers: out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for a few rows m of x, the shape of
// every projection in a decode step (quant/kernels/fused_linear.py). A step at batch 1 reads each weight once and
// does two flops per byte pair, so the GEMV is a stream of the weights; cuBLAS runs it as a split-K GEMM plus a
// reduction kernel for most of Qwen3-8B's shapes (runs 49-50). Here one CTA owns ROWS output rows and all of K:
// its threads stride over K with 16-byte weight loads issued kUnroll iterations ahead, accumulate in float32,
// and reduce across the CTA, so each output is written once, rounded once, with no second kernel.
//
// GATED: the MLP's act(gate(x)) * up(x) with SiLU in one launch: the CTA also reads the ROWS matching rows of the
// up weight and writes silu(g) * u, rounded the way transformers' three kernels round (g, silu(g), u and the
// product each to the output dtype).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oscar {

struct GemvParams {
  const void* x;     // [m, k], rows x_stride elements apart, 16-byte aligned, x_stride % 8 == 0
  const void* w0;    // [n, k] contiguous (the gate rows when gated)
  const void* w1;    // [n, k] contiguous up rows (gated), else unused
  const void* bias;  // [n] or nullptr (not gated)
  void* out;         // [m, n] contiguous
  int64_t x_stride;
  int m, n, k;       // k % 8 == 0
};

constexpr int kGemvThreads = 256;
constexpr int kGemvUnroll = 2;  // K iterations whose loads are in flight together
constexpr int kGemvMaxRows = 8;  // rows of x (tokens) one launch takes

template <typename T>
struct GemvType;
template <>
struct GemvType<__nv_bfloat16> {
  using pair = __nv_bfloat162;
  static __device__ __forceinline__ float2 f2(uint32_t v) { return __bfloat1622float2(*reinterpret_cast<pair*>(&v)); }
  static __device__ __forceinline__ __nv_bfloat16 round(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float f(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <>
struct GemvType<__half> {
  using pair = __half2;
  static __device__ __forceinline__ float2 f2(uint32_t v) { return __half22float2(*reinterpret_cast<pair*>(&v)); }
  static __device__ __forceinline__ __half round(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float f(__half v) { return __half2float(v); }
};

__device__ __forceinline__ uint4 gemv_ld_weight(const uint4* p) {  // read once: keep it out of L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = GemvType<T>::f2(wv[i]), b = GemvType<T>::f2(xv[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// grid.x = ceil(n / ROWS); M >= p.m rows of x (the rest are never written); NW weight rows per CTA.
template <typename T, int M, int ROWS, bool GATED>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvParams p) {
  constexpr int NW = GATED ? 2 * ROWS : ROWS;
  constexpr int WARPS = kGemvThreads / 32;
  __shared__ float red[WARPS][NW][M];
  const int n0 = blockIdx.x * ROWS;
  const int here = min(ROWS, p.n - n0);
  const int kvec = p.k / 8;  // 16-byte words per row
  const uint4* w[NW];
#pragma unroll
  for (int r = 0; r < NW; ++r) {  // rows past n re-read the last row; their sums are never written
    const int n = n0 + min(r % ROWS, here - 1);
    w[r] = reinterpret_cast<const uint4*>(r < ROWS ? p.w0 : p.w1) + static_cast<int64_t>(n) * kvec;
  }
  const uint4* x[M];
#pragma unroll
  for (int m = 0; m < M; ++m)
    x[m] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + static_cast<int64_t>(min(m, p.m - 1)) * p.x_stride);

  float acc[NW][M];
#pragma unroll
  for (int r = 0; r < NW; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  for (int base = threadIdx.x; base < kvec; base += kGemvThreads * kGemvUnroll) {
    uint4 wv[kGemvUnroll][NW], xv[kGemvUnroll][M];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int v = base + u * kGemvThreads;
      const bool in = v < kvec;
#pragma unroll
      for (int r = 0; r < NW; ++r) wv[u][r] = in ? gemv_ld_weight(w[r] + v) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int m = 0; m < M; ++m) xv[u][m] = in ? __ldg(x[m] + v) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u)
#pragma unroll
      for (int r = 0; r < NW; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = dot8<T>(wv[u][r], xv[u][m], acc[r][m]);
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < NW; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) red[warp][r][m] = s;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * M; i += kGemvThreads) {
    const int r = i / M, m = i % M;
    if (r >= here || m >= p.m) continue;
    float s0 = 0.f;
#pragma unroll
    for (int j = 0; j < WARPS; ++j) s0 += red[j][r][m];
    T y;
    if constexpr (GATED) {
      float s1 = 0.f;
#pragma unroll
      for (int j = 0; j < WARPS; ++j) s1 += red[j][ROWS + r][m];
      const float g = GemvType<T>::f(GemvType<T>::round(s0));  // gate_proj's output
      const float a = GemvType<T>::f(GemvType<T>::round(g / (1.f + expf(-g))));  // silu, as torch computes it
      const float up = GemvType<T>::f(GemvType<T>::round(s1));  // up_proj's output
      y = GemvType<T>::round(a * up);
    } else {
      if (p.bias != nullptr) s0 += GemvType<T>::f(static_cast<const T*>(p.bias)[n0 + r]);  // a GEMM epilogue's bias
      y = GemvType<T>::round(s0);
    }
    static_cast<T*>(p.out)[static_cast<int64_t>(m) * p.n + n0 + r] = y;
  }
}

template <typename T, int M, int ROWS>
cudaError_t launch_gemv_rows(const GemvParams& p, bool gated, cudaStream_t stream) {
  const dim3 grid((p.n + ROWS - 1) / ROWS);
  if (gated)
    gemv_kernel<T, M, ROWS, true><<<grid, kGemvThreads, 0, stream>>>(p);
  else
    gemv_kernel<T, M, ROWS, false><<<grid, kGemvThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int M>
cudaError_t launch_gemv_m(const GemvParams& p, int rows, bool gated, cudaStream_t stream) {
  switch (rows) {
    case 1: return launch_gemv_rows<T, M, 1>(p, gated, stream);
    case 2: return launch_gemv_rows<T, M, 2>(p, gated, stream);
    case 4: return launch_gemv_rows<T, M, 4>(p, gated, stream);
    default: return cudaErrorInvalidValue;
  }
}

// rows: output rows per CTA (1, 2 or 4); p.m <= kGemvMaxRows rows of x, run by the kernel for 1, 2, 4 or 8.
template <typename T>
cudaError_t launch_gemv(const GemvParams& p, int rows, bool gated, cudaStream_t stream) {
  if (p.m < 1 || p.m > kGemvMaxRows || p.n < 1 || p.k < 8 || p.k % 8 != 0) return cudaErrorInvalidValue;
  if (p.m == 1) return launch_gemv_m<T, 1>(p, rows, gated, stream);
  if (p.m == 2) return launch_gemv_m<T, 2>(p, rows, gated, stream);
  if (p.m <= 4) return launch_gemv_m<T, 4>(p, rows, gated, stream);
  return launch_gemv_m<T, 8>(p, rows, gated, stream);
}

}  // namespace oscar
