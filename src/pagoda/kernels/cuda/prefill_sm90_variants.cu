/// Instantiations of the Hopper prefill's prepared variants (kernel options, off by default):
/// fp8 e4m3 K/V at D 128 (sm90_fp8) and DQK 192 / DV 128 at 64-key tiles (sm90_mla_k64), each
/// with and without the plan's unit lists.

#include "pagoda/kernels/cuda/prefill_sm90_launch.cuh"

namespace pagoda::kernels::cuda::raw {

cudaError_t prefill_sm90_variant(const AttentionArgs& args, const detail::Sm90Sched& sched,
                                 int blocks, bool pingpong, bool overlap, cudaStream_t stream) {
  const auto run = [&]<typename T>() -> cudaError_t {
    if (args.kv_dtype == ElemType::kE4M3 && args.head_dim_qk == 128 && args.head_dim_v == 128) {
      return launch_config<T, 128, 128, detail::E4M3, 0>(args, sched, blocks, pingpong, overlap,
                                                         stream);
    }
    if (args.kv_dtype == args.q_dtype && args.head_dim_qk == 192 && args.head_dim_v == 128 &&
        args.variants.sm90_mla_k64) {
      return launch_config<T, 192, 128, T, 64>(args, sched, blocks, pingpong, overlap, stream);
    }
    return cudaErrorNotSupported;
  };
  if (args.q_dtype == ElemType::kBF16) return run.template operator()<__nv_bfloat16>();
  if (args.q_dtype == ElemType::kF16) return run.template operator()<__half>();
  return cudaErrorNotSupported;
}

}  // namespace pagoda::kernels::cuda::raw
