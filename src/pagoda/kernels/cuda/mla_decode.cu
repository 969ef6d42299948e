/// Instantiations and raw launcher of the tensor-core paged MLA decode kernel (mla_decode_kernel.cuh).

#include <atomic>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/mla_decode_kernel.cuh"

namespace pagoda::kernels::cuda::raw {
namespace {

/// Calls f.template operator()<KV>() for a supported latent type; false when none.
template <typename F>
bool dispatch_mla(ElemType kv, F&& f) {
  if (kv == ElemType::kBF16) {
    f.template operator()<__nv_bfloat16>();
    return true;
  }
  if (kv == ElemType::kE4M3) {
    f.template operator()<detail::E4M3>();
    return true;
  }
  return false;
}

/// The current device's opt-in shared memory per block (cached per device; 0 when unknown).
int device_smem_optin() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 0;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace

bool mla_decode_supported(ElemType q, ElemType kv, ElemType out, int num_kv_heads,
                          int head_dim_qk, int head_dim_v) {
  if (q != ElemType::kBF16 || out != ElemType::kBF16) return false;
  if (num_kv_heads != 1 || head_dim_qk != 576 || head_dim_v != 512) return false;
  size_t need = 0;  // the two-group kernel's (the larger) buffers
  if (!dispatch_mla(kv, [&]<typename KV>() { need = detail::MlaDecodeConfig<KV, 2>::kSmemBytes; })) {
    return false;
  }
  return size_t(device_smem_optin()) >= need;
}

cudaError_t mla_decode(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  if (args.num_kv_heads != 1 || args.head_dim_qk != 576 || args.head_dim_v != 512 ||
      args.q_dtype != ElemType::kBF16 || args.out_dtype != ElemType::kBF16) {
    return cudaErrorNotSupported;
  }
  if (mla_decode_sm90_chosen(args.q_dtype, args.kv_dtype, args.out_dtype, args.variants)) {
    return mla_decode_sm90(args, stream);
  }
  cudaError_t st = cudaErrorNotSupported;
  const int heads = mla_decode_heads_per_block(args.num_qo_heads);
  const dim3 grid(args.grid_items * ((args.num_qo_heads + heads - 1) / heads));
  auto launch = [&]<typename KV, int G>() {
    using Cfg = detail::MlaDecodeConfig<KV, G>;
    st = detail::launch_attention(detail::mla_decode_kernel<KV, G>, grid, Cfg::kThreads,
                                  Cfg::kSmemBytes, args, stream);
  };
  dispatch_mla(args.kv_dtype, [&]<typename KV>() {
    if (heads == 32) {
      launch.template operator()<KV, 2>();
    } else {
      launch.template operator()<KV, 1>();
    }
  });
  return st;
}

int mla_decode_block_heads(ElemType q, ElemType kv, ElemType out, int num_qo_heads,
                           const CudaLaunchVariants& v) {
  if (mla_decode_sm90_chosen(q, kv, out, v)) return mla_decode_sm90_block_heads(num_qo_heads, v);
  return mla_decode_heads_per_block(num_qo_heads);
}

}  // namespace pagoda::kernels::cuda::raw
