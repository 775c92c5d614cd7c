// Decode-time linear layers: out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for a few rows m of x, the shape of
// every projection in a decode step (quant/kernels/fused_linear.py). A step at batch 1 reads each weight once and
// does two flops per byte pair, so the GEMV is a stream of the weights; cuBLAS runs it as a split-K GEMM plus a
// reduction kernel for most of Qwen3-8B's shapes (docs/PERFORMANCE.md, Layer kernels). Here one CTA owns ROWS output rows and all of K:
// its threads stride over K with 16-byte weight loads issued kUnroll iterations ahead, accumulate in float32,
// and reduce across the CTA, so each output is written once, rounded once, with no second kernel.
//
// Segments: up to three weights of one input in one launch (the attention's q, k and v projections): the grid is
// their CTAs laid end to end, each CTA in one segment, each segment with its own bias and output.
//
// GATED: the MLP's act(gate(x)) * up(x) with SiLU in one launch: the CTA also reads the ROWS matching rows of the
// up weight and writes silu(g) * u, rounded the way transformers' three kernels round (g, silu(g), u and the
// product each to the output dtype).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "oscar_type16.cuh"

namespace oscar {

constexpr int kGemvMaxSegments = 3;

struct GemvParams {
  const void* x;  // [m, k], rows x_stride elements apart, 16-byte aligned, x_stride % 8 == 0
  int64_t x_stride;
  int m, k;       // k % 8 == 0
  int segments;   // 1 to kGemvMaxSegments (1 when gated)
  const void* w[kGemvMaxSegments];     // [n_s, k] contiguous (the gate rows when gated)
  const void* bias[kGemvMaxSegments];  // [n_s] or nullptr
  void* out[kGemvMaxSegments];         // [m, n_s] contiguous
  int n[kGemvMaxSegments];
  int cta_end[kGemvMaxSegments];  // CTAs of segments 0..s together (the launcher fills it)
  const void* w_up;  // gated: [n_0, k] contiguous up rows
};

template <typename P>
__device__ __forceinline__ P gemv_pick(const P (&a)[kGemvMaxSegments], int s) {  // no dynamic param indexing
  return s == 0 ? a[0] : (s == 1 ? a[1] : a[2]);
}

constexpr int kGemvThreads = 256;
constexpr int kGemvUnroll = 2;  // K iterations whose loads are in flight together
constexpr int kGemvMaxRows = 8;  // rows of x (tokens) one launch takes

template <typename T>
using GemvType = Type16<T>;

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

// grid.x = sum over segments of ceil(n_s / ROWS); M >= p.m rows of x (the rest are never written); NW weight rows
// per CTA.
template <typename T, int M, int ROWS, bool GATED>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvParams p) {
  constexpr int NW = GATED ? 2 * ROWS : ROWS;
  constexpr int WARPS = kGemvThreads / 32;
  __shared__ float red[WARPS][NW][M];
  const int seg = (p.segments > 1 && static_cast<int>(blockIdx.x) >= p.cta_end[0]) +
                  (p.segments > 2 && static_cast<int>(blockIdx.x) >= p.cta_end[1]);
  const int n_seg = gemv_pick(p.n, seg);
  const int n0 = (static_cast<int>(blockIdx.x) - (seg ? gemv_pick(p.cta_end, seg - 1) : 0)) * ROWS;
  const int here = min(ROWS, n_seg - n0);
  const void* w_seg = gemv_pick(p.w, seg);
  const int kvec = p.k / 8;  // 16-byte words per row
  const uint4* w[NW];
#pragma unroll
  for (int r = 0; r < NW; ++r) {  // rows past n re-read the last row; their sums are never written
    const int n = n0 + min(r % ROWS, here - 1);
    w[r] = reinterpret_cast<const uint4*>(r < ROWS ? w_seg : p.w_up) + static_cast<int64_t>(n) * kvec;
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
      const T* bias = static_cast<const T*>(gemv_pick(p.bias, seg));
      if (bias != nullptr) s0 += GemvType<T>::f(bias[n0 + r]);  // a GEMM epilogue's bias, before the rounding
      y = GemvType<T>::round(s0);
    }
    static_cast<T*>(gemv_pick(p.out, seg))[static_cast<int64_t>(m) * n_seg + n0 + r] = y;
  }
}

template <typename T, int M, int ROWS>
cudaError_t launch_gemv_rows(const GemvParams& params, bool gated, cudaStream_t stream) {
  GemvParams p = params;
  int ctas = 0;
  for (int s = 0; s < kGemvMaxSegments; ++s) {
    if (s < p.segments) ctas += (p.n[s] + ROWS - 1) / ROWS;
    p.cta_end[s] = ctas;
  }
  if (gated)
    gemv_kernel<T, M, ROWS, true><<<ctas, kGemvThreads, 0, stream>>>(p);
  else
    gemv_kernel<T, M, ROWS, false><<<ctas, kGemvThreads, 0, stream>>>(p);
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
  if (p.m < 1 || p.m > kGemvMaxRows || p.k < 8 || p.k % 8 != 0 || p.segments < 1 || p.segments > kGemvMaxSegments ||
      (gated && (p.segments != 1 || p.w_up == nullptr)))
    return cudaErrorInvalidValue;
  for (int s = 0; s < p.segments; ++s)
    if (p.n[s] < 1) return cudaErrorInvalidValue;
  if (p.m == 1) return launch_gemv_m<T, 1>(p, rows, gated, stream);
  if (p.m == 2) return launch_gemv_m<T, 2>(p, rows, gated, stream);
  if (p.m <= 4) return launch_gemv_m<T, 4>(p, rows, gated, stream);
  return launch_gemv_m<T, 8>(p, rows, gated, stream);
}

}  // namespace oscar
