// Thin torch bindings for the decode-time linear kernels (include/oscar_gemv.cuh): check tensors, fill the
// parameter struct, launch. Built once per target arch by quant/kernels/cuda.py (`load_linear`).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "include/oscar_gemv.cuh"

namespace {

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// x [m, k] (last dim contiguous, row stride % 8 == 0), w0 (and w1 when gated) [n, k] contiguous, bias [n] or empty
// -> [m, n] in x's dtype. gated: silu(x w0^T) * (x w1^T), rounded as transformers' MLP rounds it.
torch::Tensor gemv(torch::Tensor x, torch::Tensor w0, torch::Tensor w1, torch::Tensor bias, bool gated, int64_t rows) {
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == torch::kHalf || dt == torch::kBFloat16, "gemv: x must be fp16 or bf16, got ", dt);
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.stride(1) == 1, "gemv: x must be a CUDA [m, k] tensor with a contiguous "
              "last dim");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(m >= 1 && m <= oscar::kGemvMaxRows, "gemv: x has ", m, " rows, the kernel takes 1 to ",
              oscar::kGemvMaxRows);
  TORCH_CHECK(k % 8 == 0 && aligned16(x) && x.stride(0) % 8 == 0, "gemv: x must be 16-byte aligned with k and the row "
              "stride divisible by 8");
  for (const torch::Tensor* w : {&w0, &w1}) {
    if (w == &w1 && !gated) break;
    TORCH_CHECK(w->is_cuda() && w->device() == x.device() && w->scalar_type() == dt && w->dim() == 2 && w->size(1) == k &&
                    w->size(0) == w0.size(0) && w->is_contiguous() && aligned16(*w),
                "gemv: weights must be contiguous, 16-byte aligned [n, ", k, "] CUDA tensors of x's dtype on its device");
  }
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!(gated && has_bias), "gemv: the gated kernel takes no bias");
  if (has_bias)
    TORCH_CHECK(bias.is_cuda() && bias.scalar_type() == dt && bias.is_contiguous() && bias.numel() == w0.size(0),
                "gemv: bias must be a contiguous [n] tensor of x's dtype");
  TORCH_CHECK(rows == 1 || rows == 2 || rows == 4, "gemv: rows per CTA must be 1, 2 or 4, got ", rows);
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty({m, w0.size(0)}, x.options());
  oscar::GemvParams p{x.data_ptr(), w0.data_ptr(), gated ? w1.data_ptr() : nullptr, has_bias ? bias.data_ptr() : nullptr,
                      out.data_ptr(), x.stride(0), static_cast<int>(m), static_cast<int>(w0.size(0)),
                      static_cast<int>(k)};
  auto stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t e = dt == torch::kHalf ? oscar::launch_gemv<__half>(p, static_cast<int>(rows), gated, stream)
                                           : oscar::launch_gemv<__nv_bfloat16>(p, static_cast<int>(rows), gated, stream);
  TORCH_CHECK(e == cudaSuccess, "gemv launch failed: ", cudaGetErrorString(e));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "decode-time linear layer (x W^T + b, or silu(x Wg^T) * (x Wu^T)) for up to 8 rows of x");
  m.attr("max_rows") = static_cast<int64_t>(oscar::kGemvMaxRows);
}
