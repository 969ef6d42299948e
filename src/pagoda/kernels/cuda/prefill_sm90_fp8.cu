/// The Hopper prefill's fp8 e4m3 K/V instantiations (D 128, the overlap schedule; the producer
/// widens the raw rows in shared memory), apart from prefill_sm90.cu so the two compile in
/// parallel.

#include "pagoda/kernels/cuda/prefill_sm90_launch.cuh"

namespace pagoda::kernels::cuda::raw {

cudaError_t prefill_sm90_fp8(const AttentionArgs& args, const detail::Sm90Sched& sched,
                             int blocks, bool pingpong, cudaStream_t stream) {
  if (args.kv_dtype != ElemType::kE4M3 || args.head_dim_qk != 128 || args.head_dim_v != 128) {
    return cudaErrorNotSupported;
  }
  if (args.q_dtype == ElemType::kBF16) {
    return launch_config<__nv_bfloat16, 128, 128, detail::E4M3>(args, sched, blocks, pingpong,
                                                                true, stream);
  }
  if (args.q_dtype == ElemType::kF16) {
    return launch_config<__half, 128, 128, detail::E4M3>(args, sched, blocks, pingpong, true,
                                                         stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace pagoda::kernels::cuda::raw
