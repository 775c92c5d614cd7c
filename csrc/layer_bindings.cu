// Thin torch bindings for the decode-time layer kernels: the linear layers (include/oscar_gemv.cuh), RMSNorm
// (include/oscar_rmsnorm.cuh) and RoPE (include/oscar_rope.cuh). Each checks its tensors, fills the parameter struct
// and launches. Built once per target arch by quant/kernels/cuda/loader.py (`load_layers`).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "include/oscar_gemv.cuh"
#include "include/oscar_msg.h"
#include "include/oscar_rmsnorm.cuh"
#include "include/oscar_rope.cuh"

namespace {

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

void check_weight(const torch::Tensor& w, const torch::Tensor& x, const char* name) {
  TORCH_CHECK(w.is_cuda() && w.device() == x.device() && w.scalar_type() == x.scalar_type() && w.dim() == 2 &&
                  w.size(1) == x.size(1) && w.size(0) >= 1 && w.is_contiguous() && aligned16(w),
              "gemv: ", name, " must be a contiguous, 16-byte aligned [n, ", oscar::num(x.size(1)), "] CUDA tensor of x's dtype on its "
              "device, got ", oscar::shape(w.sizes()), " ", w.scalar_type());
}

// x [m, k] (last dim contiguous, row stride % 8 == 0); weights: 1 to 3 [n_s, k] contiguous tensors, biases: one
// [n_s] tensor or an empty one each; w_up: empty, or [n_0, k] for the gated kernel (one weight, no bias)
// -> one [m, n_s] output per weight, in x's dtype. gated: silu(x w^T) * (x w_up^T), rounded as transformers' MLP.
std::vector<torch::Tensor> gemv(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases,
                                torch::Tensor w_up, int64_t rows) {
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == torch::kHalf || dt == torch::kBFloat16, "gemv: x must be fp16 or bf16, got ", dt);
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.stride(1) == 1, "gemv: x must be a CUDA [m, k] tensor with a contiguous "
              "last dim");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(m >= 1 && m <= oscar::kGemvMaxRows, "gemv: x has ", oscar::num(m), " rows, the kernel takes 1 to ",
              oscar::num(oscar::kGemvMaxRows));
  TORCH_CHECK(k % 8 == 0 && aligned16(x) && x.stride(0) % 8 == 0, "gemv: x must be 16-byte aligned with k and the row "
              "stride divisible by 8");
  const int segments = static_cast<int>(weights.size());
  TORCH_CHECK(segments >= 1 && segments <= oscar::kGemvMaxSegments && biases.size() == weights.size(),
              "gemv: 1 to ", oscar::num(oscar::kGemvMaxSegments), " weights, and as many biases (empty tensors for none)");
  const bool gated = w_up.numel() > 0;
  TORCH_CHECK(rows == 1 || rows == 2 || rows == 4, "gemv: rows per CTA must be 1, 2 or 4, got ", oscar::num(rows));
  oscar::GemvParams p{};
  p.x = x.data_ptr(), p.x_stride = x.stride(0), p.m = static_cast<int>(m), p.k = static_cast<int>(k);
  p.segments = segments;
  std::vector<torch::Tensor> outs;
  for (int s = 0; s < segments; ++s) {
    check_weight(weights[s], x, "weight");
    const int64_t n = weights[s].size(0);
    if (biases[s].numel() > 0) {
      TORCH_CHECK(!gated, "gemv: the gated kernel takes no bias");
      TORCH_CHECK(biases[s].is_cuda() && biases[s].scalar_type() == dt && biases[s].is_contiguous() &&
                      biases[s].numel() == n,
                  "gemv: a bias must be a contiguous [n] tensor of x's dtype");
      p.bias[s] = biases[s].data_ptr();
    }
    outs.push_back(torch::empty({m, n}, x.options()));
    p.w[s] = weights[s].data_ptr(), p.out[s] = outs.back().data_ptr(), p.n[s] = static_cast<int>(n);
  }
  if (gated) {
    TORCH_CHECK(segments == 1, "gemv: the gated kernel takes one weight pair");
    check_weight(w_up, x, "w_up");
    TORCH_CHECK(w_up.size(0) == weights[0].size(0), "gemv: gate and up weights must have the same shape");
    p.w_up = w_up.data_ptr();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t e = dt == torch::kHalf ? oscar::launch_gemv<__half>(p, static_cast<int>(rows), gated, stream)
                                           : oscar::launch_gemv<__nv_bfloat16>(p, static_cast<int>(rows), gated, stream);
  TORCH_CHECK(e == cudaSuccess, "gemv launch failed: ", cudaGetErrorString(e));
  return outs;
}

bool fp16_or_bf16(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

// x [rows, n] (last dim contiguous, 16-byte aligned rows), weight [n] of x's dtype -> [rows, n] contiguous.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_cuda() && fp16_or_bf16(x) && x.dim() == 2 && x.stride(1) == 1,
              "rms_norm: x must be a CUDA fp16/bf16 [rows, n] tensor with a contiguous last dim");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(n >= 8 && n % 8 == 0 && n <= oscar::kNormMaxN && aligned16(x) && (rows <= 1 || x.stride(0) % 8 == 0),
              "rms_norm: n must be a multiple of 8 up to ", oscar::num(oscar::kNormMaxN), " with 16-byte aligned rows, got n ", oscar::num(n));
  TORCH_CHECK(weight.is_cuda() && weight.device() == x.device() && weight.scalar_type() == x.scalar_type() &&
                  weight.dim() == 1 && weight.size(0) == n && weight.is_contiguous() && aligned16(weight),
              "rms_norm: weight must be a contiguous, 16-byte aligned [", oscar::num(n), "] tensor of x's dtype on its device");
  auto out = torch::empty({rows, n}, x.options());
  oscar::NormParams p{x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, rows <= 1 ? n : x.stride(0),
                      static_cast<int>(n), static_cast<float>(eps)};
  const c10::cuda::CUDAGuard guard(x.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t e = x.scalar_type() == torch::kHalf ? oscar::launch_rms_norm<__half>(p, stream)
                                                        : oscar::launch_rms_norm<__nv_bfloat16>(p, stream);
  TORCH_CHECK(e == cudaSuccess, "rms_norm launch failed: ", cudaGetErrorString(e));
  return out;
}

bool rope_layout(const torch::Tensor& t, int64_t dims) {  // 8-byte aligned, strides in whole 4-element units
  if (t.dim() != dims || t.stride(dims - 1) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 8) return false;
  for (int64_t i = 0; i + 1 < dims; ++i)
    if (t.size(i) > 1 && t.stride(i) % 4) return false;
  return true;
}

// q [B, Hq, L, D], k [B, Hk, L, D], cos / sin [B or 1, L, D] (same strides), one fp16/bf16 dtype, D % 8 == 0
// -> (q rotated, k rotated), each with its input's strides (torch::empty_like).
std::vector<torch::Tensor> rope(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(q.is_cuda() && fp16_or_bf16(q), "rope: q must be a CUDA fp16/bf16 tensor");
  for (const auto* t : {&k, &cos, &sin})
    TORCH_CHECK(t->device() == q.device() && t->scalar_type() == q.scalar_type(), "rope: k, cos and sin must share q's "
                "device and dtype");
  TORCH_CHECK(rope_layout(q, 4) && rope_layout(k, 4) && rope_layout(cos, 3) && rope_layout(sin, 3),
              "rope: q, k must be [B, H, L, D] and cos, sin [B or 1, L, D] with contiguous last dims, 8-byte aligned, "
              "strides divisible by 4");
  const int64_t b = q.size(0), length = q.size(2), d = q.size(3);
  TORCH_CHECK(d % 8 == 0 && k.size(0) == b && k.size(2) == length && k.size(3) == d && cos.sizes() == sin.sizes() &&
                  cos.strides() == sin.strides() && (cos.size(0) == 1 || cos.size(0) == b) && cos.size(1) == length &&
                  cos.size(2) == d,
              "rope: shapes q ", oscar::shape(q.sizes()), ", k ", oscar::shape(k.sizes()), ", cos ", oscar::shape(cos.sizes()), " do not match (D % 8 == 0)");
  auto oq = torch::empty_like(q), ok = torch::empty_like(k);
  oscar::RopeParams p{q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr(), oq.data_ptr(), ok.data_ptr(),
                      static_cast<int>(length), static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
                      static_cast<int>(d),
                      q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                      oq.stride(0), oq.stride(1), oq.stride(2), ok.stride(0), ok.stride(1), ok.stride(2),
                      cos.size(0) == 1 ? 0 : cos.stride(0), cos.stride(1)};
  const c10::cuda::CUDAGuard guard(q.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t e = q.scalar_type() == torch::kHalf ? oscar::launch_rope<__half>(p, b, stream)
                                                        : oscar::launch_rope<__nv_bfloat16>(p, b, stream);
  TORCH_CHECK(e == cudaSuccess, "rope launch failed: ", cudaGetErrorString(e));
  return {oq, ok};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "decode-time linear layers for up to 8 rows of x: x W_s^T + b_s for 1-3 weights in one launch, "
        "or silu(x W^T) * (x W_up^T)");
  m.def("rms_norm", &rms_norm, "RMSNorm of [rows, n] fp16/bf16 rows, transformers' Llama/Qwen formula and rounding");
  m.def("rope", &rope, "rotary embedding of q and k with transformers' rounding (apply_rotary_pos_emb)");
  m.attr("max_rows") = static_cast<int64_t>(oscar::kGemvMaxRows);
  m.attr("max_segments") = static_cast<int64_t>(oscar::kGemvMaxSegments);
}
