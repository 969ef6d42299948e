/// Raw launcher of the Hopper MLA decode kernel (mla_decode_sm90_kernel.cuh).

#include <cstdlib>
#include <cstring>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/mla_decode_sm90_kernel.cuh"

namespace pagoda::kernels::cuda::raw {

bool mla_decode_sm90_chosen(ElemType q, ElemType kv, ElemType out, int num_qo_heads) {
  if (q != ElemType::kBF16 || kv != ElemType::kBF16 || out != ElemType::kBF16) return false;
  // PAGODA_MLA_SM90: 0 = never, 2 = every head count (a block of 64 rows, the live heads first),
  // else from kMlaSm90Heads heads up.
  const char* e = std::getenv("PAGODA_MLA_SM90");
  const int mode = e == nullptr || *e == '\0' ? 1 : std::atoi(e);
  if (mode == 0 || (mode != 2 && num_qo_heads < kMlaSm90Heads)) return false;
  // The kernel's 231,456 bytes of shared memory fit every sm_90 part (static_assert in its
  // config).
  return detail::device_runs_sm90a(detail::mla_decode_sm90_kernel);
}

cudaError_t mla_decode_sm90(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  using C = detail::MlaSm90Config;
  const dim3 grid(args.grid_items * ((args.num_qo_heads + C::kHeads - 1) / C::kHeads));
  return detail::launch_attention(detail::mla_decode_sm90_kernel, grid, C::kThreads, C::kSmemBytes,
                                  args, stream);
}

}  // namespace pagoda::kernels::cuda::raw
