/// Instantiations and raw launcher of the tensor-core paged prefill / extend kernel.

#include "pagoda/kernels/cuda/dispatch.cuh"
#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/prefill_kernel.cuh"

namespace pagoda::kernels::cuda::raw {

cudaError_t prefill(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  if (args.prefill_sm90) {  // items of prefill_rows_per_tile(D, true) rows: only the sm90 kernel
    if (!prefill_sm90_supported(args.q_dtype, args.kv_dtype, args.head_dim_qk, args.head_dim_v,
                                args.variants)) {
      return cudaErrorNotSupported;
    }
    return prefill_sm90(args, stream);
  }
  cudaError_t st = cudaErrorNotSupported;
  const dim3 grid(args.grid_items, args.num_kv_heads);
  detail::dispatch_fast(args.q_dtype, args.kv_dtype, args.head_dim_qk,
                        [&]<typename T, typename KV, int D>() {
    using Cfg = detail::PrefillConfig<T, KV, D>;
    st = detail::launch_attention(detail::prefill_kernel<T, KV, D>, grid, Cfg::kThreads,
                                  Cfg::kSmemBytes, args, stream);
  });
  return st;
}

}  // namespace pagoda::kernels::cuda::raw
