// Shared device helpers for the OScaR kernels: tensor-core MMA, INT2 fragment extraction, reductions,
// and the in-shared-memory Walsh-Hadamard transform. No torch headers: raw pointers only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace oscar {

#ifndef OSCAR_WARPS
#define OSCAR_WARPS 4  // warps of a decode CTA: 4, or 8-12 with OSCAR_MIN_BLOCKS 1 (quant/kernels/cuda/plan.py NARROW / WIDE)
#endif
constexpr int kWarps = OSCAR_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kGroup = 32;        // tokens per key scale group = channels per value group
constexpr int kMaxSplits = 1024;  // split-KV partials per (b, kv head), residual split included
#ifndef OSCAR_STAGES
#define OSCAR_STAGES 4  // an experiment's build flag (OSCAR_KERNEL_FLAGS, quant/kernels/cuda/loader.py)
#endif
#ifndef OSCAR_WARM_MERGE
#define OSCAR_WARM_MERGE 1  // row 0's window CTA runs the merge's code early (decode_split_kernel; 0 for A/B)
#endif
#ifndef OSCAR_WARM_MERGE_ROWS
#define OSCAR_WARM_MERGE_ROWS 8  // ... where a row has at least this many query rows per KV head (the thinker's 8)
#endif
#ifndef OSCAR_EVICT_FIRST
#define OSCAR_EVICT_FIRST 1  // stream the cache with an L2 evict-first policy (0: normal, for A/B)
#endif
#ifndef OSCAR_SKELETON
#define OSCAR_SKELETON 0  // diagnostics (wrong output): 1 the decode's loads without the groups' math, 2 the math alone
#endif
constexpr int kStages = OSCAR_STAGES;  // cp.async pipeline depth per warp (32-token groups in flight)

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

// The same product with bf16 inputs (the full-precision window of a bf16 model, read as stored).
__device__ __forceinline__ void mma16816_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma16816 with inputs of type T (__half or __nv_bfloat16).
template <typename T>
__device__ __forceinline__ void mma16816_t(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816_t<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  mma16816(d, a, b0, b1);
}
template <>
__device__ __forceinline__ void mma16816_t<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  mma16816_bf16(d, a, b0, b1);
}

// Four 8x8 b16 matrices from shared memory: lanes 8 j .. 8 j + 7 give the row addresses of matrix j, which
// lands in r[j] as the standard fragment (lane 4 g + c: row g, columns 2c, 2c + 1); .trans: of its transpose.
// volatile: kept in order with the cp.async waits and issues around it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Two floats as a pair of T (__half or __nv_bfloat16), round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) { return pack_half2(lo, hi); }
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ __half2 as_half2(uint32_t x) { return *reinterpret_cast<__half2*>(&x); }
__device__ __forceinline__ uint32_t as_u32(__half2 x) { return *reinterpret_cast<uint32_t*>(&x); }

// Transpose of an 8x8 b16 matrix held as the standard fragment (lane 4 g + c: row g, columns 2c, 2c+1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Pair slot S of a frag-order word (fields S and S + 8: bits 2S and 16 + 2S) as an fp16 pair of subnormals: the
// field is masked where it sits (slots 0-3: bits 0, 2, 4, 6) or after one shift of the word by 8 (slots 4-7 land
// on the same bits), mantissa bit p weighing 2^(p - 24). A word's 16 codes take 1 shift and 8 LOP3s, and slots S and
// S + 4, which a D = 64 fragment mixes, share a unit. No offset enters a sum (the tensor cores' fp32 sums of an
// offset B would lose the low bits of B * sum(q s)); the units differ by slot, so the keys' query fragments are
// scaled by 2^-p (query_fragments) and the values' sums by 2^(24 - p) at the end (fold_values).
template <int D>
struct SlotMap {
  // Shift right by shift(s); the field then sits at bit pos(s).
  __host__ __device__ static constexpr int shift(int s) { return s < 4 ? 0 : 8; }
  __host__ __device__ static constexpr int pos(int s) { return 2 * (s & 3); }
};

// Pair slot S of a code word as an fp16 pair of subnormals c x 2^(pos - 24), in ONE LOP3 after the slot's shift
// (SlotMap):
// - key codes (kValue false): (lo, hi), x & mask;
// - value codes (kValue true): (q_even, 3 - q_odd), (x ^ flip) & mask (0x48): the odd token's (high half's) code
//   mirrored. The decode negates the odd token's B operand to match, (3 - q) (-s p) = (q - 3) s p, and adds 3 s p
//   back through its zero (z + 3 s): the running sum then takes q s p and (q - 3) s p in turn, so it carries no
//   offset along a split (oscar_decode.cuh group_step).
template <int D, int S, bool kValue>
__device__ __forceinline__ uint32_t code_slot(uint32_t w) {
  constexpr int kShift = SlotMap<D>::shift(S), kPos = SlotMap<D>::pos(S);
  static_assert(kPos >= 0 && kPos <= 8, "field outside the fp16 mantissa");
  const uint32_t x = w >> kShift;
  constexpr uint32_t kMask = 0x00030003u << kPos;
  if constexpr (kValue) {
    constexpr uint32_t kFlip = 0x00030000u << kPos;
    uint32_t y;
    asm("lop3.b32 %0, %1, %2, %3, 0x48;\n" : "=r"(y) : "r"(x), "r"(kMask), "r"(kFlip));
    return y;
  } else {
    return x & kMask;
  }
}

// code_slot with the slot known after unrolling (the switch folds away).
template <int D, bool kValue>
__device__ __forceinline__ uint32_t code_pair(uint32_t w, int s) {
  switch (s) {
    case 0: return code_slot<D, 0, kValue>(w);
    case 1: return code_slot<D, 1, kValue>(w);
    case 2: return code_slot<D, 2, kValue>(w);
    case 3: return code_slot<D, 3, kValue>(w);
    case 4: return code_slot<D, 4, kValue>(w);
    case 5: return code_slot<D, 5, kValue>(w);
    case 6: return code_slot<D, 6, kValue>(w);
    default: return code_slot<D, 7, kValue>(w);
  }
}

// 2^x with one MUFU.EX2 (exp2f adds a denormal fix-up around it); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// 16 bytes, or 16 zero bytes when !full (nothing is read then; src must still be a valid address).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0));
}

// The same copy with an L2 eviction-priority policy (createpolicy), e.g. evict_first for data read once.
__device__ __forceinline__ void cp_async16_hint(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy));
}

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ __half2 hmul2u(uint32_t a, uint32_t b) { return __hmul2(as_half2(a), as_half2(b)); }

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

// The first 3 butterfly stages (h = 1, 2, 4) of 8 consecutive elements in registers (the lower element keeps
// a + b, the upper a - b), in fwht_rows' order.
__device__ __forceinline__ void fwht8(float (&x)[8]) {
#pragma unroll
  for (int h = 1; h < 8; h <<= 1)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (!(i & h)) {
        const float a = x[i], b = x[i + h];
        x[i] = a + b, x[i + h] = a - b;
      }
}

// Natural-order Walsh-Hadamard transform (unnormalized) of one row of D floats held by D / 8 consecutive lanes,
// 8 consecutive elements each (lane j of the row: elements 8 j .. 8 j + 7): 3 butterfly stages in registers,
// log2(D / 8) across lanes with shuffles. No shared memory, no barrier.
template <int D>
__device__ __forceinline__ void fwht_lanes(float (&x)[8]) {
  fwht8(x);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < D / 8; m <<= 1) {
    const bool hi = lane & m;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float y = __shfl_xor_sync(0xffffffffu, x[i], m);
      x[i] = hi ? y - x[i] : x[i] + y;
    }
  }
}

}  // namespace oscar
