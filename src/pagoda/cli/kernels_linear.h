#pragma once
/// `pagoda kernels --op linear-decode | linear-prefill`: times a linear-attention backend
/// (attention/linear_backend.h: the Mamba2 causal conv + selective scan, reference / cpu / cuda)
/// on one shape over a real kv::StatePool in the backend's memory, beside the copy bandwidth and
/// GEMM rate measured in the same run (KernelClock), as `pagoda kernels` does for attention.
///
///   linear-decode   `batch` sequences of one token each (the one-step update);
///   linear-prefill  `batch` sequences of `tokens` tokens each, from a fresh (zero) state (the
///                   scan of a prefill; chunked or per token, as the backend computes it).
///
/// Timing: each sample is one forward of every layer of the pool in turn (for linear-decode the
/// pool has as many layers as make its states >= 512 MiB, at most 64, so no sample runs from the
/// last-level cache; a prefill's pool has one layer, zeroed before each sample, untimed),
/// between a stream synchronisation before and after on the steady clock; the sample / layers is
/// one forward's time (on the GPU, back-to-back launches overlap their launch latency as in a
/// model's layer loop). Bytes and FLOPs are the algorithmic minimum of one forward: states read
/// and written once (conv + SSM), the xBC and dt rows read, y written, and per token 2·K FLOPs per
/// conv channel plus 5 per SSM state element (decay, outer product, output dot). Errors: a bad
/// size or an unknown backend throws pagoda::Error before anything is allocated.

#include <string>

namespace pagoda::cli {

struct LinearKernelArgs {
  std::string backend = "cpu";
  std::string op = "linear-decode";  ///< linear-decode | linear-prefill
  int batch = 16;
  int tokens = 8192;  ///< linear-prefill: tokens per sequence
  int heads = 64;     ///< H
  int head_dim = 64;  ///< P
  int state_size = 128;  ///< N (d_state)
  int groups = 1;        ///< G
  int conv_kernel = 4;   ///< K
  int chunk_size = 256;  ///< the SSD chunk (a hint to chunked backends)
  int iters = 20;
  int warmup = 3;
  int threads = 1;  ///< the host ceilings' threads and the host backends' OpenMP threads
  bool json = false;
};

void run_linear_kernels(const LinearKernelArgs& a);

}  // namespace pagoda::cli
