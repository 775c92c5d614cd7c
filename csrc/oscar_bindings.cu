// Thin torch bindings for the OScaR kernels: check tensors, fill the raw parameter structs, launch.
// Compiled once per head dim (OSCAR_HEAD_DIM) by quant/kernels/cuda/loader.py through torch.utils.cpp_extension.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "include/oscar_decode.cuh"
#include "include/oscar_floor.cuh"
#include "include/oscar_msg.h"
#include "include/oscar_pack.cuh"

#ifndef OSCAR_HEAD_DIM
#error "define OSCAR_HEAD_DIM (64 or 128)"
#endif
constexpr int D = OSCAR_HEAD_DIM;

namespace {

void check(const torch::Tensor& t, const char* name, torch::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}

// A field of a Python value read by name (the decode's inputs and plan), with the field named if it is missing.
template <typename T>
T field(py::handle obj, const char* owner, const char* name) {
  TORCH_CHECK(py::hasattr(obj, name), owner, " has no field '", name, "'");
  return obj.attr(name).cast<T>();
}

// x: quant.kernels.common.DecodeInputs (q [B, Hq, Lq, D] in the residual dtype, fp16/bf16; packed tensors as
// quant.packed); plan: quant.kernels.common.DecodePlan made for x's shape (quant/kernels/cuda/plan.py make_plan).
// Both are read by field name, so the launch's parameters are spelled once, in DecodeParams below. Returns out like q.
torch::Tensor decode(py::handle x, py::handle plan, torch::Tensor counters, torch::Tensor trace, double scaling,
                     bool rotate, bool rotate_out) {
  const char* in = "the decode inputs (DecodeInputs)";
  const char* pl = "the decode plan (DecodePlan)";
  const auto q = field<torch::Tensor>(x, in, "q"), kc = field<torch::Tensor>(x, in, "kc");
  const auto ks = field<torch::Tensor>(x, in, "ks"), kz = field<torch::Tensor>(x, in, "kz");
  const auto vc = field<torch::Tensor>(x, in, "vc"), vs = field<torch::Tensor>(x, in, "vs");
  const auto vz = field<torch::Tensor>(x, in, "vz"), norms = field<torch::Tensor>(x, in, "norms");
  const auto k_res = field<torch::Tensor>(x, in, "k_res"), v_res = field<torch::Tensor>(x, in, "v_res");
  const auto kv_lens = field<torch::Tensor>(x, in, "kv_lens"), res_lens = field<torch::Tensor>(x, in, "res_lens");
  const int64_t tokens = field<int64_t>(x, in, "tokens");
  const int64_t num_splits = field<int64_t>(plan, pl, "splits"), split_tokens = field<int64_t>(plan, pl, "split_tokens");
  const int64_t order = field<int64_t>(plan, pl, "order"), merge_group = field<int64_t>(plan, pl, "merge_group");
  const bool window_cta = field<bool>(plan, pl, "window_cta");
  TORCH_CHECK(field<int64_t>(plan, pl, "tokens") == tokens, "the plan was made for ",
              oscar::num(field<int64_t>(plan, pl, "tokens")), " tokens, the inputs hold ", oscar::num(tokens));
  TORCH_CHECK(q.dim() == 4 && q.size(3) == D, "q must be [B, Hq, Lq, ", oscar::num(D), "]");
  const auto dt = q.scalar_type();
  TORCH_CHECK(dt == torch::kHalf || dt == torch::kBFloat16, "q must be fp16 or bf16");
  check(q, "q", dt);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0, "q must be 16-byte aligned (the kernel reads "
              "8 channels per load): pass a fresh contiguous tensor");
  check(kc, "key codes", torch::kInt32), check(ks, "key scale", torch::kHalf), check(kz, "key zero", torch::kHalf);
  check(vc, "value codes", torch::kInt32), check(vs, "value scale", torch::kHalf), check(vz, "value zero", torch::kHalf);
  check(norms, "norms", torch::kFloat32), check(kv_lens, "kv_lens", torch::kInt32), check(res_lens, "res_lens", torch::kInt32);
  check(counters, "counters", torch::kInt32);
  TORCH_CHECK(k_res.scalar_type() == dt && v_res.scalar_type() == dt, "residual K/V must have q's dtype");
  TORCH_CHECK(k_res.stride(3) == 1 && v_res.stride(3) == 1, "residual K/V need a contiguous last dim");
  for (const auto* r : {&k_res, &v_res})  // the window is read with 16-byte loads
    TORCH_CHECK(reinterpret_cast<uintptr_t>(r->data_ptr()) % 16 == 0 && r->stride(0) % 8 == 0 && r->stride(1) % 8 == 0 &&
                    r->stride(2) % 8 == 0,
                "residual K/V must be 16-byte aligned with strides divisible by 8 elements (make them contiguous)");
  const int64_t b = q.size(0), hkv = k_res.size(1);
  TORCH_CHECK(q.size(1) % hkv == 0, "query heads must be a multiple of KV heads");
  const int64_t group = q.size(1) / hkv, lq = q.size(2);
  TORCH_CHECK(group * lq <= 16, "group * Lq = ", oscar::num(group * lq), " exceeds the 16 rows of one tile");
  TORCH_CHECK(tokens % 32 == 0 && split_tokens % 32 == 0, "tokens and split_tokens must be multiples of 32");
  TORCH_CHECK(num_splits + 1 <= oscar::kMaxSplits, "too many splits: ", oscar::num(num_splits));
  TORCH_CHECK(merge_group >= 0, "merge_group must be >= 0");
  const int64_t groups = merge_group > 0 && window_cta ? (num_splits + merge_group - 1) / merge_group : 0;
  TORCH_CHECK(counters.numel() >= b * hkv * (1 + groups),
              "counters must hold a zeroed int32 per (batch, kv head), and per (batch, kv head, merge group)");
  const c10::cuda::CUDAGuard guard(q.device());
  auto f32 = q.options().dtype(torch::kFloat32);
  auto part_o = torch::empty({b * hkv, num_splits + 1, group * lq, D}, f32);
  auto part_ml = torch::empty({b * hkv, num_splits + 1, 2, group * lq}, f32);
  auto out = torch::empty_like(q);
  oscar::DecodeParams p{q.data_ptr(), kc.data_ptr<int32_t>(), reinterpret_cast<const __half*>(ks.data_ptr()),
                        reinterpret_cast<const __half*>(kz.data_ptr()), vc.data_ptr<int32_t>(),
                        reinterpret_cast<const __half*>(vs.data_ptr()), reinterpret_cast<const __half*>(vz.data_ptr()),
                        norms.data_ptr<float>(), k_res.data_ptr(), v_res.data_ptr(), k_res.stride(0), k_res.stride(1),
                        k_res.stride(2), v_res.stride(0), v_res.stride(1), v_res.stride(2), kv_lens.data_ptr<int32_t>(),
                        res_lens.data_ptr<int32_t>(), part_o.data_ptr<float>(), part_ml.data_ptr<float>(),
                        counters.data_ptr<int32_t>(), out.data_ptr(), static_cast<int>(hkv), static_cast<int>(group), static_cast<int>(lq),
                        static_cast<int>(tokens), static_cast<int>(num_splits), static_cast<int>(split_tokens),
                        static_cast<float>(scaling * 1.4426950408889634), rotate, rotate_out, window_cta,
                        static_cast<int>(order), static_cast<int>(merge_group), nullptr};
  if (trace.numel() > 0) {  // diagnostics: per CTA kTraceSlots u64 (harness/bench/dev/sweep_splits.py)
    TORCH_CHECK(trace.scalar_type() == torch::kInt64 && trace.is_cuda() && trace.is_contiguous() &&
                    trace.numel() >= (num_splits + 1) * b * hkv * oscar::kTraceSlots,
                "trace must be a contiguous int64 CUDA tensor of (splits + 1) * B * Hkv * ", oscar::num(oscar::kTraceSlots));
    p.trace = reinterpret_cast<unsigned long long*>(trace.data_ptr<int64_t>());
  }
  auto stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t e = dt == torch::kHalf ? oscar::launch_decode<D, __half>(p, b, stream)
                                           : oscar::launch_decode<D, __nv_bfloat16>(p, b, stream);
  check_cuda(e, "oscar decode launch");
  return out;
}

// k, v [B, H, T, D] (fp16/bf16/fp32, last dim contiguous), T % 32 == 0 -> (kc, ks, kz, vc, vs, vz, norms),
// codes in the frag order and value scales/zeros per block as [D/32][32] (quant/packed.py).
std::vector<torch::Tensor> pack(torch::Tensor k, torch::Tensor v, bool rotate, bool token_norm, bool rotate_values,
                                bool integer_zero) {
  TORCH_CHECK(k.dim() == 4 && k.sizes() == v.sizes() && k.size(3) == D, "K and V must be [B, H, T, ", oscar::num(D), "]");
  TORCH_CHECK(k.is_cuda() && v.is_cuda() && k.scalar_type() == v.scalar_type(), "K and V: CUDA, same dtype");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "K and V need a contiguous last dim");
  const int64_t b = k.size(0), h = k.size(1), t = k.size(2);
  TORCH_CHECK(t % 32 == 0, "a packed block needs a multiple of 32 tokens, got ", oscar::num(t));
  const c10::cuda::CUDAGuard guard(k.device());
  auto i32 = k.options().dtype(torch::kInt32), f16 = k.options().dtype(torch::kHalf);
  auto kc = torch::empty({b, h, t / 16, D}, i32), ks = torch::empty({b, h, t / 32, D}, f16), kz = torch::empty_like(ks);
  auto vc = torch::empty({b, h, t, D / 16}, i32), vs = torch::empty({b, h, t, D / 32}, f16), vz = torch::empty_like(vs);
  auto f32 = k.options().dtype(torch::kFloat32);  // with token_norm the kernel writes every norm: no fill kernel
  auto norms = token_norm ? torch::empty({b, t}, f32) : torch::ones({b, t}, f32);
  oscar::PackParams p{k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                      v.stride(2), kc.data_ptr<int32_t>(), reinterpret_cast<__half*>(ks.data_ptr()),
                      reinterpret_cast<__half*>(kz.data_ptr()), vc.data_ptr<int32_t>(),
                      reinterpret_cast<__half*>(vs.data_ptr()), reinterpret_cast<__half*>(vz.data_ptr()),
                      norms.data_ptr<float>(), static_cast<int>(h), static_cast<int>(t), rotate, token_norm, rotate_values,
                      integer_zero};
  auto stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t e;
  switch (k.scalar_type()) {
    case torch::kHalf: e = oscar::launch_pack<D, __half>(p, b, stream); break;
    case torch::kBFloat16: e = oscar::launch_pack<D, __nv_bfloat16>(p, b, stream); break;
    case torch::kFloat32: e = oscar::launch_pack<D, float>(p, b, stream); break;
    default: TORCH_CHECK(false, "K/V dtype must be fp16, bf16 or fp32, got ", k.scalar_type());
  }
  check_cuda(e, "oscar pack launch");
  return {kc, ks, kz, vc, vs, vz, norms};
}

// Speed-of-light references (harness/bench/floor.py): stream all bytes of buf once with `ctas` CTAs of `threads`
// (async: by cp.async with the L2 evict-first policy, the decode's path; else ld.global.nc into registers);
// launch `ctas` empty CTAs that ask for `smem` bytes of shared memory. sink: a CUDA int32 tensor of >= 1 element.
void read_floor(torch::Tensor buf, torch::Tensor sink, int64_t ctas, int64_t threads, bool async) {
  TORCH_CHECK(buf.is_cuda() && buf.is_contiguous() && buf.nbytes() % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(buf.data_ptr()) % 16 == 0,
              "read_floor needs a contiguous, 16-byte aligned CUDA buffer of a multiple of 16 bytes");
  check(sink, "sink", torch::kInt32);
  const c10::cuda::CUDAGuard guard(buf.device());
  check_cuda(oscar::launch_read_floor(buf.data_ptr(), static_cast<int64_t>(buf.nbytes()), static_cast<int>(ctas),
                                      static_cast<int>(threads), async,
                                      reinterpret_cast<unsigned*>(sink.data_ptr<int32_t>()),
                                      c10::cuda::getCurrentCUDAStream()),
             "read_floor launch");
}

void empty_launch(torch::Tensor sink, int64_t ctas, int64_t threads, int64_t smem) {
  check(sink, "sink", torch::kInt32);
  const c10::cuda::CUDAGuard guard(sink.device());
  check_cuda(oscar::launch_empty(static_cast<int>(ctas), static_cast<int>(threads), static_cast<int>(smem),
                                 reinterpret_cast<unsigned*>(sink.data_ptr<int32_t>()), c10::cuda::getCurrentCUDAStream()),
             "empty_launch");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode, "OScaR split-KV decode attention over the packed INT2 cache (frag code order)", py::arg("x"),
        py::arg("plan"), py::arg("counters"), py::arg("trace"), py::arg("scaling"), py::arg("rotate"),
        py::arg("rotate_out"));
  m.def("pack", &pack, "OScaR rotate + token norm + INT2 quantize + pack of a block of K, V");
  m.def("read_floor", &read_floor, "stream a buffer once (the decode's byte floor, harness/bench/floor.py)");
  m.def("empty_launch", &empty_launch, "launch empty CTAs (the decode's launch floor)");
  m.attr("head_dim") = D;
  m.attr("decode_smem_bytes") = static_cast<int64_t>(sizeof(oscar::DecodeSmem<D, 1>));  // <= 8 query rows
}
