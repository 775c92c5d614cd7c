// Speed-of-light references for the decode kernel (harness/bench/floor.py): what any kernel pays to stream a
// given number of bytes once, and to launch a grid of the decode kernel's shape, timed the way the decode is.
// They compute nothing useful; their times bound what the decode kernel can reach.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "oscar_common.cuh"

namespace oscar {

__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// CTA c reads the 16-byte words [c * per_cta, (c + 1) * per_cta) of src with kFloorUnroll loads in flight per
// thread (like a split of the decode kernel over its tokens) and XORs them; the store that keeps the loads alive
// never happens in practice (the XOR of random data would have to equal the constant).
constexpr int kFloorUnroll = 8;
constexpr unsigned kFloorMagic = 0x9E3779B9u;

__device__ __forceinline__ unsigned xor4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Plain non-caching loads into registers.
__global__ void read_floor_kernel(const uint4* src, int64_t words, int64_t per_cta, unsigned* sink) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per_cta;
  const int64_t end = begin + per_cta < words ? begin + per_cta : words;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kFloorUnroll;
  unsigned acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += step) {
    uint4 v[kFloorUnroll];
#pragma unroll
    for (int u = 0; u < kFloorUnroll; ++u) {
      const int64_t j = i + static_cast<int64_t>(u) * blockDim.x;
      v[u] = j < end ? ld_stream16(src + j) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kFloorUnroll; ++u) acc ^= xor4(v[u]);
  }
  if (acc == kFloorMagic) sink[0] = acc;
}

// The decode kernel's path: cp.async with the L2 evict-first policy into a two-slot shared ring per thread
// (kFloorUnroll words a slot, two slots in flight), each slot XORed from shared memory once it lands. (The
// evict-first hint on ld.global.nc above measured no different from none; on cp.async it keeps the lines
// a dirty flush left from being written back during the read.)
__global__ void read_floor_async_kernel(const uint4* src, int64_t words, int64_t per_cta, unsigned* sink) {
  extern __shared__ uint4 ring[];  // [2][kFloorUnroll][blockDim.x]
  const uint64_t policy = l2_evict_first_policy();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per_cta;
  const int64_t end = begin + per_cta < words ? begin + per_cta : words;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kFloorUnroll;
  const int n = blockDim.x, t = threadIdx.x;
  unsigned acc = 0;
  auto consume = [&](int slot, int64_t i) {  // the words thread t copied for position i
#pragma unroll
    for (int u = 0; u < kFloorUnroll; ++u)
      if (i + static_cast<int64_t>(u) * n < end) acc ^= xor4(ring[(slot * kFloorUnroll + u) * n + t]);
  };
  int k = 0;
  int64_t i = begin + t;
  for (; i < end; i += step, ++k) {
    const int slot = k & 1;
#pragma unroll
    for (int u = 0; u < kFloorUnroll; ++u) {
      const int64_t j = i + static_cast<int64_t>(u) * n;
      if (j < end) cp_async16_hint(smem_addr(&ring[(slot * kFloorUnroll + u) * n + t]), src + j, policy);
    }
    cp_async_commit();
    cp_async_wait<1>();
    if (k > 0) consume(slot ^ 1, i - step);
  }
  cp_async_wait<0>();
  if (k > 0) consume((k - 1) & 1, i - step);
  if (acc == kFloorMagic) sink[0] = acc;
}

// The launch alone: a grid of `ctas` CTAs asking for `smem` bytes of dynamic shared memory, doing nothing.
__global__ void empty_kernel(unsigned* sink) {
  if (sink != nullptr && blockIdx.x == 0x7fffffff) sink[0] = 1u;
}

// async: the cp.async evict-first kernel (threads <= 256: its ring takes 256 bytes a thread).
static cudaError_t launch_read_floor(const void* src, int64_t bytes, int ctas, int threads, bool async,
                                     unsigned* sink, cudaStream_t stream) {
  if (bytes % 16 != 0 || ctas < 1 || threads < 32 || threads > (async ? 256 : 1024)) return cudaErrorInvalidValue;
  const int64_t words = bytes / 16, per_cta = (words + ctas - 1) / ctas;
  const uint4* p = static_cast<const uint4*>(src);
  if (async) {
    const int smem = 2 * kFloorUnroll * threads * 16;
    static bool raised = false;
    if (!raised) {
      const cudaError_t e = cudaFuncSetAttribute(read_floor_async_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 2 * kFloorUnroll * 256 * 16);
      if (e != cudaSuccess) return e;
      raised = true;
    }
    read_floor_async_kernel<<<ctas, threads, smem, stream>>>(p, words, per_cta, sink);
  } else {
    read_floor_kernel<<<ctas, threads, 0, stream>>>(p, words, per_cta, sink);
  }
  return cudaGetLastError();
}

static cudaError_t launch_empty(int ctas, int threads, int smem, unsigned* sink, cudaStream_t stream) {
  static int allowed = 48 * 1024;  // raised once per size, outside graph captures in practice (floor.py warms up)
  if (smem > allowed) {
    const cudaError_t e = cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    allowed = smem;
  }
  empty_kernel<<<ctas, threads, smem, stream>>>(sink);
  return cudaGetLastError();
}

}  // namespace oscar
