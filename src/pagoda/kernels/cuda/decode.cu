/// Instantiations and raw launcher of the tensor-core split-KV paged decode kernel.

#include "pagoda/kernels/cuda/decode_tc_kernel.cuh"
#include "pagoda/kernels/cuda/decode_tct_kernel.cuh"
#include "pagoda/kernels/cuda/dispatch.cuh"
#include "pagoda/kernels/cuda/launch_raw.h"

namespace pagoda::kernels::cuda::raw {

bool fast_path(ElemType q, ElemType kv, int head_dim) {
  return detail::dispatch_fast(q, kv, head_dim, [&]<typename T, typename KV, int D>() {
    static_assert(D % 64 == 0 && sizeof(T) == 2 && sizeof(KV) <= 2);
  });
}

int decode_blocks_per_sm(ElemType q, ElemType kv, int head_dim) {
  int blocks = 1;
  detail::dispatch_fast(q, kv, head_dim, [&]<typename T, typename KV, int D>() {
    using Cfg = detail::DecodeTcConfig<T, KV, D>;
    auto kernel = detail::decode_tc_kernel<T, KV, D>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Cfg::kSmemBytes)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Cfg::kThreads,
                                                      Cfg::kSmemBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      blocks = 1;
    }
    if constexpr (!std::is_same_v<T, KV>) {
      // fp8 groups <= 8 run the transposed kernel; plan with the smaller occupancy of the two.
      using TCfg = detail::DecodeTctConfig<T, D>;
      auto tkernel = detail::decode_tct_kernel<T, D>;
      int tb = 1;
      if (cudaFuncSetAttribute(tkernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(TCfg::kSmemBytes)) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&tb, tkernel, TCfg::kThreads,
                                                        TCfg::kSmemBytes) != cudaSuccess) {
        (void)cudaGetLastError();
        tb = 1;
      }
      blocks = tb < blocks ? tb : blocks;
    }
  });
  return blocks < 1 ? 1 : blocks;
}

cudaError_t decode(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  cudaError_t st = cudaErrorNotSupported;
  const int group = args.num_qo_heads / args.num_kv_heads;
  const dim3 grid(args.grid_items, args.num_kv_heads,
                  (group + kDecodeMaxGroup - 1) / kDecodeMaxGroup);
  detail::dispatch_fast(args.q_dtype, args.kv_dtype, args.head_dim_qk,
                        [&]<typename T, typename KV, int D>() {
    if constexpr (!std::is_same_v<T, KV>) {
      if (group <= detail::kDecodeTctMaxGroup) {
        using TCfg = detail::DecodeTctConfig<T, D>;
        st = detail::launch_attention(detail::decode_tct_kernel<T, D>,
                                      dim3(args.grid_items, args.num_kv_heads, 1), TCfg::kThreads,
                                      TCfg::kSmemBytes, args, stream);
        return;
      }
    }
    using Cfg = detail::DecodeTcConfig<T, KV, D>;
    st = detail::launch_attention(detail::decode_tc_kernel<T, KV, D>, grid, Cfg::kThreads,
                                  Cfg::kSmemBytes, args, stream);
  });
  return st;
}

}  // namespace pagoda::kernels::cuda::raw
