/// Raw launcher of the Hopper MLA decode kernel (mla_decode_sm90_kernel.cuh).

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/mla_decode_sm90_kernel.cuh"
#include "pagoda/kernels/cuda/mla_decode_sm90_small_kernel.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/tma_map.h"

namespace pagoda::kernels::cuda::raw {

bool mla_decode_sm90_chosen(ElemType q, ElemType kv, ElemType out, const CudaLaunchVariants& v) {
  if (q != ElemType::kBF16 || out != ElemType::kBF16) return false;
  if (kv != ElemType::kBF16 && kv != ElemType::kE4M3) return false;  // e4m3: widened in place
  // At every head count and page size (a block of 64 rows, the live heads first): on the H200
  // at 6d3aaae (bench/results/mla_h200.md) it was faster than the mma.sync kernel at h_q 16 on
  // pages 64 and 1 (1.12x, 1.11x) and at h_q 32 on page 1 (1.24x). e4m3 latents too (widened
  // in shared memory; the mma.sync kernel ran them at 27 % of copy bandwidth, slower than
  // bf16). v.mla_sm90 = false keeps the mma.sync kernel.
  if (!v.mla_sm90) return false;
  // The kernel's 231,472 bytes of shared memory fit every sm_90 part (static_assert in its
  // config).
  return detail::device_runs_sm90a(detail::mla_decode_sm90_kernel<true, false>);
}

int mla_decode_sm90_block_heads(int num_qo_heads, const CudaLaunchVariants& v) {
  // The transposed kernel at h_q <= 16 (its wgmma N is the heads); v.mla_sm90_small = false
  // keeps the 64-row kernel there.
  if (num_qo_heads <= kMlaSm90SmallHeads && v.mla_sm90_small) {
    return kMlaSm90SmallHeads;
  }
  return kMlaSm90Heads;
}

namespace {

/// The latent tensor map of a launch (MlaSm90Map): boxes of paged_box_rows() keys at page sizes
/// >= 16, else rows = 0 (every tile by cp.async); a.variants.mla_tma = false turns TMA off.
detail::MlaSm90Map latent_map(const AttentionArgs& a) {
  detail::MlaSm90Map m{};
  if (!a.variants.mla_tma) return m;
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
  if (args.page_size < 1) return cudaErrorInvalidValue;  // FastDiv::make needs a divisor >= 1
  // The planner sized the work items for this block size (mla_decode_block_heads).
  const int heads = mla_decode_sm90_block_heads(args.num_qo_heads, args.variants);
  const bool small = heads == kMlaSm90SmallHeads;
  const dim3 grid(args.grid_items * ((args.num_qo_heads + heads - 1) / heads));
  detail::MlaSm90Map map = latent_map(args);
  map.page = detail::FastDiv::make(args.page_size);
  const bool tma = map.rows > 0, fp8 = args.kv_dtype == ElemType::kE4M3;
  auto pick = [&](auto k_tt, auto k_tf, auto k_ft, auto k_ff) {
    return tma ? (fp8 ? k_tt : k_tf) : (fp8 ? k_ft : k_ff);
  };
  auto kernel = small ? pick(detail::mla_decode_sm90_small_kernel<true, true>,
                             detail::mla_decode_sm90_small_kernel<true, false>,
                             detail::mla_decode_sm90_small_kernel<false, true>,
                             detail::mla_decode_sm90_small_kernel<false, false>)
                      : pick(detail::mla_decode_sm90_kernel<true, true>,
                             detail::mla_decode_sm90_kernel<true, false>,
                             detail::mla_decode_sm90_kernel<false, true>,
                             detail::mla_decode_sm90_kernel<false, false>);
  const size_t smem =
      small ? detail::MlaSm90SmallConfig::kSmemBytes : detail::MlaSm90Config::kSmemBytes;
  const int threads =
      small ? detail::MlaSm90SmallConfig::kThreads : detail::MlaSm90Config::kThreads;
  const cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem));
  if (st != cudaSuccess) return st;
  return launch_pdl(kernel, grid, dim3(threads), smem, stream, args,
                    detail::make_logit_transform(args.sm_scale, args.logit_cap, args.k_scale), map);
}

}  // namespace pagoda::kernels::cuda::raw
