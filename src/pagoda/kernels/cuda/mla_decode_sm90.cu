/// Raw launcher of the Hopper MLA decode kernel (mla_decode_sm90_kernel.cuh).

#include <cstdlib>
#include <cstring>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/mla_decode_sm90_kernel.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/tma_map.h"

namespace pagoda::kernels::cuda::raw {

bool mla_decode_sm90_chosen(ElemType q, ElemType kv, ElemType out, int num_qo_heads,
                            int page_size) {
  if (q != ElemType::kBF16 || kv != ElemType::kBF16 || out != ElemType::kBF16) return false;
  // PAGODA_MLA_SM90: 0 = never, 2 = every head count and page size (a block of 64 rows, the
  // live heads first), else from kMlaSm90Heads heads up, and below that where the latent tiles
  // come by TMA (page sizes >= 16): at h_q 16 the Hopper kernel then measured 13 % faster than
  // the mma.sync kernel on the H200 (bench/results/mla_h200.md). At page 1 it was 1.4x slower
  // with the first cp.async gather and 1.14x faster (h_q 16; 1.33x at 32) with the row-group
  // gather that replaced it; routing page 1 here too is not yet tested on a GPU
  // (mla_tma_h200_31227eb/route_all_heads_untested.patch).
  const char* e = std::getenv("PAGODA_MLA_SM90");
  const int mode = e == nullptr || *e == '\0' ? 1 : std::atoi(e);
  if (mode == 0) return false;
  if (mode != 2 && num_qo_heads < kMlaSm90Heads &&
      box_rows_for_page(page_size, detail::MlaSm90Config::kKeys) == 0) {
    return false;
  }
  // The kernel's 231,456 bytes of shared memory fit every sm_90 part (static_assert in its
  // config).
  return detail::device_runs_sm90a(detail::mla_decode_sm90_kernel<true>);
}

namespace {

/// The latent tensor map of a launch (MlaSm90Map): boxes of paged_box_rows() keys at page sizes
/// >= 16, else rows = 0 (every tile by cp.async). PAGODA_MLA_TMA=0 turns TMA off (read per
/// call, for same-process A/B runs).
detail::MlaSm90Map latent_map(const AttentionArgs& a) {
  detail::MlaSm90Map m{};
  const char* e = std::getenv("PAGODA_MLA_TMA");
  if (e != nullptr && std::strcmp(e, "0") == 0) return m;
  const int rows = paged_box_rows(a.k, a.page_size, detail::MlaSm90Config::kKeys);
  if (rows == 0 || !encode_paged_map(m.latent, a.k, a.kv_dtype, detail::MlaSm90Config::kDqk,
                                     a.num_kv_heads, a.page_size, rows)) {
    return detail::MlaSm90Map{};
  }
  m.rows = rows;
  return m;
}

}  // namespace

cudaError_t mla_decode_sm90(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  using C = detail::MlaSm90Config;
  const dim3 grid(args.grid_items * ((args.num_qo_heads + C::kHeads - 1) / C::kHeads));
  const detail::MlaSm90Map map = latent_map(args);
  auto kernel = map.rows > 0 ? detail::mla_decode_sm90_kernel<true>
                             : detail::mla_decode_sm90_kernel<false>;
  const cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(C::kSmemBytes));
  if (st != cudaSuccess) return st;
  return launch_pdl(kernel, grid, dim3(C::kThreads), C::kSmemBytes, stream, args,
                    detail::make_logit_transform(args.sm_scale, args.logit_cap, args.k_scale),
                    map);
}

}  // namespace pagoda::kernels::cuda::raw
