/// Instantiations and raw launcher of the Hopper (sm_90a) paged prefill / extend kernel.

#include <algorithm>
#include <atomic>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/prefill_sm90_launch.cuh"

namespace pagoda::kernels::cuda::raw {
namespace {

/// Head dims of the sm90 kernel: DQK = DV = 64, 128, 256, and DQK 192 / DV 128.
bool sm90_dims(int dqk, int dv) {
  return (dqk == dv && (dqk == 64 || dqk == 128 || dqk == 256)) || (dqk == 192 && dv == 128);
}

template <typename F>
bool dispatch_sm90(ElemType q, int dqk, int dv, F&& f) {
  auto with_d = [&](auto t_tag) {
    using T = decltype(t_tag);
    if (!sm90_dims(dqk, dv)) return false;
    if (dqk == 64) return f.template operator()<T, 64, 64>(), true;
    if (dqk == 128) return f.template operator()<T, 128, 128>(), true;
    if (dqk == 192) return f.template operator()<T, 192, 128>(), true;
    return f.template operator()<T, 256, 256>(), true;
  };
  if (q == ElemType::kBF16) return with_d(__nv_bfloat16{});
  if (q == ElemType::kF16) return with_d(__half{});
  return false;
}

}  // namespace

bool prefill_sm90_supported(ElemType q, ElemType kv, int head_dim_qk, int head_dim_v,
                            const CudaLaunchVariants& v) {
  if (q != ElemType::kBF16 && q != ElemType::kF16) return false;
  // fp8 e4m3 K/V: D 128 under the overlap schedule only.
  const bool fp8 =
      kv == ElemType::kE4M3 && v.sm90_overlap && head_dim_qk == 128 && head_dim_v == 128;
  if (q != kv && !fp8) return false;
  if (!sm90_dims(head_dim_qk, head_dim_v)) return false;
  return detail::device_runs_sm90a(
      detail::prefill_sm90_kernel<__nv_bfloat16, 128, 128, false, false>);
}

namespace {

/// Multiprocessors of the current device (cached per device; 132 when the query fails).
int device_sm_count() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
      cudaGetLastError();
      v = 132;
    }
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace

cudaError_t prefill_sm90(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  // FastDiv::make needs divisors >= 1 (the backend has checked the head counts already).
  if (args.num_kv_heads < 1 || args.num_qo_heads < args.num_kv_heads || args.page_size < 1) {
    return cudaErrorInvalidValue;
  }
  cudaError_t st = cudaErrorNotSupported;
  // Persistent grid: one block per SM at most, each running a sequence of (item, kv head)
  // units. The plan's variants (args.variants) choose:
  //   sm90_persistent = false — one block per unit (the non-persistent kernel);
  //   sm90_max_blocks = n     — at most n blocks (tests: many units per block);
  //   sm90_head_major         — head-major order (kHeadMajor), else the item-major snake;
  //   sm90_pingpong = 0 / 1   — consumers without / with ping-pong (-1: at D >= 128).
  const CudaLaunchVariants& v = args.variants;
  const int64_t units = int64_t(args.grid_items) * args.num_kv_heads;
  int blocks = device_sm_count();
  if (!v.sm90_persistent) blocks = static_cast<int>(units);
  if (v.sm90_max_blocks > 0) blocks = std::min(blocks, v.sm90_max_blocks);
  blocks = static_cast<int>(std::min<int64_t>(blocks, units));
  detail::Sm90Sched sched;
  sched.order = v.sm90_head_major ? detail::kHeadMajor : detail::kItemSnake;
  sched.g = detail::FastDiv::make(args.num_qo_heads / args.num_kv_heads);
  sched.hkv = detail::FastDiv::make(args.num_kv_heads);
  sched.items = detail::FastDiv::make(args.grid_items);
  sched.page = detail::FastDiv::make(args.page_size);
  // Ping-pong consumers (kPingPong) by default at DQK >= 128, where they measured 1-8 % faster on
  // the H200 (bench/results/hopper_h200.md; 9-11 % at DQK 192 / DV 128); at D = 64 they cost
  // 3 %. v.sm90_pingpong = 0 / 1 overrides.
  const int pp_env = v.sm90_pingpong;
  // Intra-warpgroup overlap of softmax and GEMMs (PrefillSm90Config::kCanOverlap: D 128).
  const bool overlap = v.sm90_overlap;
  const auto launch = [&]<typename T, int DQK, int DV>() {
    const bool pingpong = pp_env == -1 ? DQK >= 128 : pp_env == 1;
    if (args.kv_dtype == ElemType::kE4M3) {  // prefill_sm90_supported: D 128, overlap on
      st = prefill_sm90_fp8(args, sched, blocks, pingpong, stream);
      return;
    }
    if (args.kv_dtype != args.q_dtype) return;  // cudaErrorNotSupported
    st = launch_config<T, DQK, DV, T>(args, sched, blocks, pingpong, overlap, stream);
  };
  dispatch_sm90(args.q_dtype, args.head_dim_qk, args.head_dim_v, launch);
  return st;
}

}  // namespace pagoda::kernels::cuda::raw
