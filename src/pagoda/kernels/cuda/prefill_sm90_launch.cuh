#pragma once
/// The Hopper prefill's launch of one configuration (prefill_sm90_kernel's template arguments),
/// shared by the translation units that instantiate its kernels: prefill_sm90.cu (the launcher
/// and the 16-bit K/V kernels) and prefill_sm90_fp8.cu (fp8 e4m3 K/V at D 128).

#include <type_traits>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/prefill_sm90_kernel.cuh"
#include "pagoda/kernels/cuda/tma_map.h"

namespace pagoda::kernels::cuda::raw {

/// The K / V tensor maps of a launch whose tiles have `keys` keys (when `wanted`: the
/// configuration copies by TMA, PrefillSm90Config::kRecords), with paged_box_rows() rows per
/// box, else rows = 0 (every tile by cp.async). a.variants.sm90_tma = false turns TMA off.
inline detail::Sm90KvMaps kv_maps(const AttentionArgs& a, int keys, bool wanted) {
  detail::Sm90KvMaps m{};
  if (!wanted || !a.variants.sm90_tma) return m;
  const int ps = a.page_size;
  const int rows = paged_box_rows(a.k, ps, keys);
  if (rows == 0 || paged_box_rows(a.v, ps, keys) != rows) return m;
  if (!encode_paged_map(m.k, a.k, a.kv_dtype, a.head_dim_qk, a.num_kv_heads, ps, rows) ||
      !encode_paged_map(m.v, a.v, a.kv_dtype, a.head_dim_v, a.num_kv_heads, ps, rows)) {
    return detail::Sm90KvMaps{};
  }
  m.rows = rows;
  return m;
}

/// The output's tensor map for the staged epilogue's TMA stores (the overlap schedule only:
/// `wanted`), when the group size divides a consumer's 64 rows and the output's rows are
/// 16-byte aligned; else o_ok stays false (the consumers copy the rows themselves).
/// a.variants.sm90_tma_store = false turns it off.
inline void out_map(detail::Sm90KvMaps& m, const AttentionArgs& a, bool wanted) {
  if (!wanted || !a.variants.sm90_tma_store) return;
  const int G = a.num_qo_heads / a.num_kv_heads;
  if (G <= 0 || 64 % G != 0 || !detail::out_rows_aligned16(a)) return;
  m.o_ok = encode_out_map(m.o, a.out, a.out_dtype, a.head_dim_v, a.num_qo_heads, a.grid_rows,
                          a.o_stride_n, a.o_stride_h, G, 64 / G);
}

using Sm90Kernel = void (*)(AttentionArgs, detail::LogitTransform, const detail::Sm90Sched,
                           const detail::Sm90KvMaps);

/// The instantiation with ping-pong and the overlap schedule as asked (the overlap where the
/// configuration has it, PrefillSm90Config::kCanOverlap; fp8 K/V: the overlap schedule only).
template <typename T, int DQK, int DV, typename KV>
Sm90Kernel pick_kernel(bool pingpong, bool overlap) {
  using detail::prefill_sm90_kernel;
  if constexpr (!std::is_same_v<KV, T>) {
    return pingpong ? prefill_sm90_kernel<T, DQK, DV, true, true, KV>
                    : prefill_sm90_kernel<T, DQK, DV, false, true, KV>;
  } else {
    if constexpr (detail::PrefillSm90Config<T, DQK, DV>::kCanOverlap) {
      if (overlap) {
        return pingpong ? prefill_sm90_kernel<T, DQK, DV, true, true, KV>
                        : prefill_sm90_kernel<T, DQK, DV, false, true, KV>;
      }
    }
    return pingpong ? prefill_sm90_kernel<T, DQK, DV, true, false, KV>
                    : prefill_sm90_kernel<T, DQK, DV, false, false, KV>;
  }
}

/// Launches the configuration (T, DQK, DV) over KV on `blocks` blocks.
template <typename T, int DQK, int DV, typename KV>
cudaError_t launch_config(const AttentionArgs& args, const detail::Sm90Sched& sched, int blocks,
                          bool pingpong, bool overlap, cudaStream_t stream) {
  using Cfg = detail::PrefillSm90Config<T, DQK, DV>;
  overlap = (overlap || !std::is_same_v<KV, T>) && Cfg::kCanOverlap;
  const Sm90Kernel kernel = pick_kernel<T, DQK, DV, KV>(pingpong, overlap);
  const cudaError_t st = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes));
  if (st != cudaSuccess) return st;
  detail::Sm90KvMaps maps = kv_maps(args, Cfg::kKeys, Cfg::kRecords);
  out_map(maps, args, overlap);  // overlap implies DQK == DV (kCanOverlap)
  return launch_pdl(kernel, dim3(blocks), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, args,
                    detail::make_logit_transform(args.sm_scale, args.logit_cap, args.k_scale),
                    sched, maps);
}

/// The fp8 e4m3 K/V launch at D 128 (prefill_sm90_fp8.cu, a translation unit of its own so it
/// compiles in parallel with the 16-bit kernels); cudaErrorNotSupported for anything else.
cudaError_t prefill_sm90_fp8(const AttentionArgs& args, const detail::Sm90Sched& sched,
                             int blocks, bool pingpong, cudaStream_t stream);

}  // namespace pagoda::kernels::cuda::raw
