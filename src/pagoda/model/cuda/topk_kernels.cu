// Row-wise top-k with log-softmax values (topk_kernels.h): one 512-thread block per row. Each
// thread keeps a sorted top-K list of its strided slice (K = k rounded up to 2/4/8/16, unrolled
// in registers) and an online (max, Σ exp) pair; the block then pops the best head k times
// (value desc, id asc) with a warp-shuffle + shared-memory argmax, and reduces the pairs.
#include "pagoda/model/cuda/topk_kernels.h"

#include <cfloat>
#include <cmath>

namespace pagoda::model::cuda_kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

/// (value, id) order of the result: larger value first, then smaller id. id −1 = empty (last).
__device__ __forceinline__ bool better(float v, int id, float w, int jd) {
  if (jd < 0) return id >= 0;
  if (id < 0) return false;
  return v > w || (v == w && id < jd);
}

template <int K>
__global__ void __launch_bounds__(kThreads) topk_kernel(const float* __restrict__ logits,
                                                        int64_t vocab, int k, int32_t* ids,
                                                        float* logprobs) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  float val[K];
  int idx[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    val[j] = -INFINITY;
    idx[j] = -1;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    if (!(v == v)) continue;  // NaN: neither a candidate nor mass
    if (v > m) {
      s = s * __expf(m - v) + 1.f;  // m = −inf: s is 0
      m = v;
    } else if (v != -INFINITY) {
      s += __expf(v - m);
    }
    // Ids rise within a thread: an equal value never displaces an earlier id.
    if (idx[K - 1] >= 0 && !(v > val[K - 1])) continue;
    val[K - 1] = v;
    idx[K - 1] = static_cast<int>(i);
#pragma unroll
    for (int j = K - 1; j > 0; --j) {
      if (idx[j - 1] < 0 || val[j] > val[j - 1]) {
        const float tv = val[j];
        val[j] = val[j - 1];
        val[j - 1] = tv;
        const int ti = idx[j];
        idx[j] = idx[j - 1];
        idx[j - 1] = ti;
      }
    }
  }
  __shared__ float sv[kWarps], sm[kWarps], ss[kWarps];
  __shared__ int si[kWarps], st[kWarps];
  __shared__ float lse_shared;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // log-sum-exp of the row.
  {
    float mm = m, sum = s;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, mm, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, sum, o);
      const float mx = fmaxf(mm, m2);
      sum = (mx == -INFINITY) ? 0.f : sum * __expf(mm - mx) + s2 * __expf(m2 - mx);
      mm = mx;
    }
    if (lane == 0) {
      sm[warp] = mm;
      ss[warp] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float M = -INFINITY;
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
      float S = 0.f;
      for (int w = 0; w < kWarps; ++w)
        if (sm[w] != -INFINITY) S += ss[w] * __expf(sm[w] - M);
      lse_shared = M == -INFINITY ? -INFINITY : M + logf(S);
    }
    __syncthreads();
  }
  const float lse = lse_shared;
  // k rounds: the block's best head is popped from its thread's list.
  for (int r = 0; r < k; ++r) {
    float bv = val[0];
    int bi = idx[0], bt = threadIdx.x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
      const int t2 = __shfl_xor_sync(0xffffffffu, bt, o);
      if (better(v2, i2, bv, bi)) {
        bv = v2;
        bi = i2;
        bt = t2;
      }
    }
    if (lane == 0) {
      sv[warp] = bv;
      si[warp] = bi;
      st[warp] = bt;
    }
    __syncthreads();
    if (warp == 0) {
      bv = lane < kWarps ? sv[lane] : -INFINITY;
      bi = lane < kWarps ? si[lane] : -1;
      bt = lane < kWarps ? st[lane] : -1;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        const int t2 = __shfl_xor_sync(0xffffffffu, bt, o);
        if (better(v2, i2, bv, bi)) {
          bv = v2;
          bi = i2;
          bt = t2;
        }
      }
      if (lane == 0) {
        ids[row * k + r] = bi;
        logprobs[row * k + r] = bi < 0 ? -INFINITY : fminf(bv - lse, 0.f);
        st[0] = bi < 0 ? -1 : bt;
      }
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) == st[0]) {  // pop the winner's head
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) {
        val[j] = val[j + 1];
        idx[j] = idx[j + 1];
      }
      val[K - 1] = -INFINITY;
      idx[K - 1] = -1;
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_topk_logprobs(const float* logits, int64_t rows, int64_t vocab, int k,
                                 int32_t* ids, float* logprobs, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || k < 1 || k > kMaxTopK || rows > 2147483647) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || ids == nullptr || logprobs == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows));
  if (k <= 2) {
    topk_kernel<2><<<grid, kThreads, 0, stream>>>(logits, vocab, k, ids, logprobs);
  } else if (k <= 4) {
    topk_kernel<4><<<grid, kThreads, 0, stream>>>(logits, vocab, k, ids, logprobs);
  } else if (k <= 8) {
    topk_kernel<8><<<grid, kThreads, 0, stream>>>(logits, vocab, k, ids, logprobs);
  } else {
    topk_kernel<16><<<grid, kThreads, 0, stream>>>(logits, vocab, k, ids, logprobs);
  }
  return cudaGetLastError();
}

}  // namespace pagoda::model::cuda_kernels
