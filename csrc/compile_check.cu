// Torch-free translation unit that instantiates every kernel specialization, so CI can check that the
// sources compile for sm_90a with the machine's nvcc alone (tests/kernels/test_csrc.py).
#include "include/oscar_decode.cuh"
#include "include/oscar_pack.cuh"

template cudaError_t oscar::launch_decode<64, __half>(const oscar::DecodeParams&, int, cudaStream_t);
template cudaError_t oscar::launch_decode<64, __nv_bfloat16>(const oscar::DecodeParams&, int, cudaStream_t);
template cudaError_t oscar::launch_decode<128, __half>(const oscar::DecodeParams&, int, cudaStream_t);
template cudaError_t oscar::launch_decode<128, __nv_bfloat16>(const oscar::DecodeParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<64, __half>(const oscar::PackParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<64, __nv_bfloat16>(const oscar::PackParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<64, float>(const oscar::PackParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<128, __half>(const oscar::PackParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<128, __nv_bfloat16>(const oscar::PackParams&, int, cudaStream_t);
template cudaError_t oscar::launch_pack<128, float>(const oscar::PackParams&, int, cudaStream_t);
#include "include/oscar_floor.cuh"
#include "include/oscar_gemv.cuh"
template cudaError_t oscar::launch_gemv<__half>(const oscar::GemvParams&, int, bool, cudaStream_t);
template cudaError_t oscar::launch_gemv<__nv_bfloat16>(const oscar::GemvParams&, int, bool, cudaStream_t);
#include "include/oscar_rmsnorm.cuh"
#include "include/oscar_rope.cuh"
template cudaError_t oscar::launch_rms_norm<__half>(const oscar::NormParams&, cudaStream_t);
template cudaError_t oscar::launch_rms_norm<__nv_bfloat16>(const oscar::NormParams&, cudaStream_t);
template cudaError_t oscar::launch_rope<__half>(const oscar::RopeParams&, int64_t, cudaStream_t);
template cudaError_t oscar::launch_rope<__nv_bfloat16>(const oscar::RopeParams&, int64_t, cudaStream_t);
// The floors' host launchers (they keep one-time setup in function-local statics: emitted here, the compile test
// checks that no such static became a symbol shared across loaded modules).
cudaError_t (*floor_launchers[])(int, int, int, unsigned*, cudaStream_t) = {&oscar::launch_empty};
cudaError_t (*read_floor_launchers[])(const void*, int64_t, int, int, bool, unsigned*, cudaStream_t) = {
    &oscar::launch_read_floor};
