// Thin torch bindings for the decode-time linear kernels (include/oscar_gemv.cuh): check tensors, fill the
// parameter struct, launch. Built once per target arch by quant/kernels/cuda.py (`load_linear`).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "include/oscar_gemv.cuh"

namespace {

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

void check_weight(const torch::Tensor& w, const torch::Tensor& x, const char* name) {
  TORCH_CHECK(w.is_cuda() && w.device() == x.device() && w.scalar_type() == x.scalar_type() && w.dim() == 2 &&
                  w.size(1) == x.size(1) && w.size(0) >= 1 && w.is_contiguous() && aligned16(w),
              "gemv: ", name, " must be a contiguous, 16-byte aligned [n, ", x.size(1), "] CUDA tensor of x's dtype on its "
              "device, got ", w.sizes(), " ", w.scalar_type());
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
  TORCH_CHECK(m >= 1 && m <= oscar::kGemvMaxRows, "gemv: x has ", m, " rows, the kernel takes 1 to ",
              oscar::kGemvMaxRows);
  TORCH_CHECK(k % 8 == 0 && aligned16(x) && x.stride(0) % 8 == 0, "gemv: x must be 16-byte aligned with k and the row "
              "stride divisible by 8");
  const int segments = static_cast<int>(weights.size());
  TORCH_CHECK(segments >= 1 && segments <= oscar::kGemvMaxSegments && biases.size() == weights.size(),
              "gemv: 1 to ", oscar::kGemvMaxSegments, " weights, and as many biases (empty tensors for none)");
  const bool gated = w_up.numel() > 0;
  TORCH_CHECK(rows == 1 || rows == 2 || rows == 4, "gemv: rows per CTA must be 1, 2 or 4, got ", rows);
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "decode-time linear layers for up to 8 rows of x: x W_s^T + b_s for 1-3 weights in one launch, "
        "or silu(x W^T) * (x W_up^T)");
  m.attr("max_rows") = static_cast<int64_t>(oscar::kGemvMaxRows);
  m.attr("max_segments") = static_cast<int64_t>(oscar::kGemvMaxSegments);
}
