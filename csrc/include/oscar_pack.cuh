// OScaR append/pack: Hadamard rotation + token norm over all KV heads + INT2 quantization + packing.
//
// norm_kernel: n_t = ||K[b, :, t, :]|| over all heads and channels (= ||K_rot||; n <= 0 -> 1), then
// pack_kernel, grid (T / 32, H, B), 128 threads: one CTA packs tokens [32 g, 32 g + 32) of one head:
//   K_rot = fwht(K) / sqrt(D)
//   keys:   per channel over the 32 tokens of K_rot / n: s = fp16((max - min) / 3), z = fp16(min),
//           code = clamp(rint((x - z) / s), 0, 3)
//   values: per token over each 32 channels of V_rot
// Rounding exactly as quant.primitives.asym_quantize; codes written in the "frag" order (oscar_layout.cuh,
// quant.packed.frag_pack) and value scales/zeros per block as [D/32][32] (quant.packed.frag_scales).
#pragma once
#include <cuda_runtime.h>

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
};

constexpr float kMinScale = 5.9604644775390625e-8f;  // quant.primitives.MIN_SCALE = 2**-24, the smallest positive fp16

// asym_quantize for one group given its min/max; returns the code of x.
__device__ __forceinline__ uint32_t quant_code(float x, float s, float z) {
  if (s <= 0.f) return 0u;  // the fp16 scale underflowed: a (near-)constant group, code 0 is its value
  const float q = rintf(__fdiv_rn(x - z, s));
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.f), 3.f));
}

// Load 32 tokens x D of one head into x[32][D + 1] (fp32) and rotate them in place.
template <int D, typename T>
__device__ void load_rotated(const T* src, int64_t st, bool rotate, float (*x)[D + 1]) {
  __syncthreads();  // x may still be read from the previous head
  for (int idx = threadIdx.x; idx < kGroup * D; idx += blockDim.x) {
    const int t = idx / D, d = idx % D;
    x[t][d] = to_float(src[t * st + d]);
  }
  if (rotate) {
    fwht_rows<D>(&x[0][0], kGroup, D + 1);
    const float inv = rsqrtf(static_cast<float>(D));
    for (int idx = threadIdx.x; idx < kGroup * D; idx += blockDim.x) x[idx / D][idx % D] *= inv;
  }
  __syncthreads();
}

// n_t = ||K[b, :, t, :]|| over all heads and channels, one warp per token. The Hadamard is orthogonal,
// so this is the norm of the rotated keys (up to fp32 rounding of the sum); n <= 0 -> 1.
template <int D, typename T>
__global__ void __launch_bounds__(kThreads) norm_kernel(const PackParams p) {
  const int t = blockIdx.x * kWarps + (threadIdx.x >> 5), b = blockIdx.y, lane = threadIdx.x & 31;
  if (t >= p.tokens) return;
  const T* kb = static_cast<const T*>(p.k) + b * p.k_sb + t * p.k_st;
  float a = 0.f;
  for (int h = 0; h < p.heads; ++h)
    for (int d = lane; d < D; d += 32) {
      const float x = to_float(kb[h * p.k_sh + d]);
      a = fmaf(x, x, a);
    }
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  if (lane == 0) {
    const float n = __fsqrt_rn(a);
    p.norms[static_cast<int64_t>(b) * p.tokens + t] = n > 0.f ? n : 1.f;
  }
}

// The block's 2 D words in the frag order from its natural codes (keys or values); thread = word.
template <int D>
__device__ void write_frag_words(const uint8_t (*codes)[D], int32_t* out, bool keys) {
  __syncthreads();  // codes were written by other threads
  for (int word = threadIdx.x; word < 2 * D; word += blockDim.x) {
    uint32_t x = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      int t, ch;
      frag_slot<D>(keys, word, i, t, ch);
      x |= static_cast<uint32_t>(codes[t][ch]) << (2 * i);
    }
    out[word] = static_cast<int32_t>(x);
  }
}

// Keys of one (32-token group, head): thread = channel.
template <int D>
__device__ void quantize_keys(const PackParams& p, int64_t bh, int grp, const float (*x)[D + 1], uint8_t (*codes)[D]) {
  if (threadIdx.x >= D) return;
  const int d = threadIdx.x;
  float lo = x[0][d], hi = x[0][d];
  for (int t = 1; t < kGroup; ++t) lo = fminf(lo, x[t][d]), hi = fmaxf(hi, x[t][d]);
  const __half s = __float2half_rn(fmaxf(__half2float(__float2half_rn(__fdiv_rn(hi - lo, 3.f))), kMinScale)), z = __float2half_rn(lo);
  const float sf = __half2float(s), zf = __half2float(z);
#pragma unroll
  for (int t = 0; t < kGroup; ++t) codes[t][d] = static_cast<uint8_t>(quant_code(x[t][d], sf, zf));
  p.ks[(bh * (p.tokens / 32) + grp) * D + d] = s;
  p.kz[(bh * (p.tokens / 32) + grp) * D + d] = z;
}

// Values of one (32-token group, head): thread = (token, 32-channel group).
template <int D>
__device__ void quantize_values(const PackParams& p, int64_t bh, int t0, const float (*x)[D + 1], uint8_t (*codes)[D]) {
  if (threadIdx.x >= kGroup * (D / 32)) return;
  const int t = threadIdx.x / (D / 32), cg = threadIdx.x % (D / 32);
  const float* row = &x[t][32 * cg];
  float lo = row[0], hi = row[0];
  for (int i = 1; i < 32; ++i) lo = fminf(lo, row[i]), hi = fmaxf(hi, row[i]);
  const __half s = __float2half_rn(fmaxf(__half2float(__float2half_rn(__fdiv_rn(hi - lo, 3.f))), kMinScale)), z = __float2half_rn(lo);
  const float sf = __half2float(s), zf = __half2float(z);
#pragma unroll
  for (int i = 0; i < 32; ++i) codes[t][32 * cg + i] = static_cast<uint8_t>(quant_code(row[i], sf, zf));
  const int64_t slot = (bh * p.tokens + t0) * (D / 32) + cg * kGroup + t;  // per block [D/32][32]
  p.vs[slot] = s;
  p.vz[slot] = z;
}

// Grid (T / 32, H, B): rotate, scale by the token norms (computed first by norm_kernel), quantize, pack.
template <int D, typename T>
__global__ void __launch_bounds__(kThreads) pack_kernel(const PackParams p) {
  __shared__ float x[kGroup][D + 1];  // +1: channel-wise walks hit distinct banks
  __shared__ uint8_t codes[kGroup][D];
  const int grp = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = kGroup * grp;
  const int64_t bh = static_cast<int64_t>(b) * p.heads + h;
  const T* kb = static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh + t0 * p.k_st;
  const T* vb = static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh + t0 * p.v_st;
  load_rotated<D, T>(kb, p.k_st, p.rotate, x);
  if (p.token_norm) {
    const float* n = p.norms + static_cast<int64_t>(b) * p.tokens + t0;
    for (int idx = threadIdx.x; idx < kGroup * D; idx += blockDim.x)
      x[idx / D][idx % D] = __fdiv_rn(x[idx / D][idx % D], n[idx / D]);
    __syncthreads();
  }
  quantize_keys<D>(p, bh, grp, x, codes);
  write_frag_words<D>(codes, p.kc + (bh * (p.tokens / 16) + 2 * grp) * D, true);
  load_rotated<D, T>(vb, p.v_st, p.rotate, x);
  quantize_values<D>(p, bh, t0, x, codes);
  write_frag_words<D>(codes, p.vc + (bh * p.tokens + t0) * (D / 16), false);
}

template <int D, typename T>
cudaError_t launch_pack(const PackParams& p, int batch, cudaStream_t stream) {
  if (p.tokens % kGroup) return cudaErrorInvalidValue;
  if (p.token_norm) {
    norm_kernel<D, T><<<dim3((p.tokens + kWarps - 1) / kWarps, batch), kThreads, 0, stream>>>(p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  pack_kernel<D, T><<<dim3(p.tokens / kGroup, p.heads, batch), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oscar
