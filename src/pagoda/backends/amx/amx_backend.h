#pragma once
/// AmxBackend ("amx"): the HostPagedBackend whose extend / prefill / mixed steps compute Q·Kᵀ and
/// P·V as bf16 matrix products on AMX tiles (Sapphire Rapids and later: pagoda's micro-kernels,
/// kernels/cpu/amx_tile.h) or through oneDNN's matmul primitive (CPUs without AMX, head dims that
/// are not multiples of 32, or AmxOptions::tiles off; AVX512-BF16, AVX-512 or f32 there: oneDNN's
/// choice); docs/design/cpu_backend.md "amx backend". Decode-only steps run on the cpu backend's
/// scheduler (CpuBatchAttention) with CpuAttentionOptions::amx_decode: its items whose rows all see
/// every key (one query per request, ≤ 16 query heads per KV head, bf16, Dqk == Dv a multiple of
/// 32) on the AMX decode kernel (kernels/cpu/amx_decode.h: Q·Kᵀ on tiles, P·V with vdpbf16ps), the
/// others on the SIMD kernels.
///
/// Extend: per (request, KV head) the request's K/V rows are gathered from the pages into
/// contiguous bf16 (AMX: K in groups of 16 keys and V in key pairs, the tiles' B layout; oneDNN:
/// rows), zero-padded to kAmxKeyAlign keys; then per work item — a tile of 64 query positions of
/// one request and KV head, the group's query heads stacked into one [group × tile, Dqk] bf16
/// operand (rows padded to 32) — S = Q·Kᵀ and acc += P·V run per key block of up to
/// kAmxKeyBlock keys with the online softmax of kernels/cpu/softmax_rows.h between them (base 2,
/// lazily raised max; P rounded to bf16 for P·V; the LSE from the unrounded p), over the key
/// blocks up to the tile's last visible key only (causal; the last block cut to a multiple of
/// kAmxKeyAlign). Gathers and tiles run in OpenMP parallel loops, one product engine and scratch
/// per thread (oneDNN runs single-threaded inside them: no nested parallelism).
/// Where oneDNN has no bf16 matmul (AVX2 CPUs) the same bf16 operands are multiplied in f32:
/// the products are exact either way, only the f32 accumulation order differs, so the backend
/// runs and is conformance-tested on every CPU (slowly there).
///
/// Supported: bf16 or f32 queries (f32 rounded to bf16, nearest even, as the Q operand is packed:
/// the CPU model's f32 activations), bf16 KV (f32 or bf16 output), GQA / MQA / MHA, any page size
/// and head dims, causal (bottom-right) and non-causal masks, LSE, mixed batches. q, out and the
/// caches need a contiguous last dimension (Error(kUnsupported) otherwise, as on "cpu"). Declared
/// refusals (capabilities; plan / run throw Error(kUnsupported) naming them too): f16 queries, f32
/// / f16 / fp8 KV, MLA, sliding window, soft cap, sinks, custom (tree) masks, multi-step draft.
/// Not chosen by any platform by default (the CPU engine's default KV is f32, which this backend
/// refuses); the CPU engine runs on it with --backend amx --kv-dtype bf16 (EngineAmx.*).

#include <memory>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"

namespace pagoda::backends {

/// Keys per block of the extend loop (a multiple of kAmxKeyAlign).
inline constexpr int kAmxKeyBlock = 256;
/// A block's key count is rounded up to a multiple of this (AMX's 16-row tiles and 32-pair bf16
/// K; fewer distinct matmul shapes), and the gathered K/V are zero-padded to it.
inline constexpr int kAmxKeyAlign = 64;

/// The amx backend's configuration.
struct AmxOptions {
  /// The decode steps' scheduler and kernels (amx_decode: the AMX decode kernel where it applies
  /// and the CPU has AMX; KernelOptions::amx_decode).
  CpuAttentionOptions decode{.amx_decode = true};
  /// The extend products on pagoda's AMX tile micro-kernels where the CPU has AMX
  /// (KernelOptions::amx_tiles); false, or no AMX: oneDNN's matmul.
  bool tiles = true;
};

/// The amx BatchAttention. Its extend throws Error(kUnsupported) in a build without oneDNN on a
/// CPU without AMX.
std::unique_ptr<attention::BatchAttention> make_amx_batch_attention(AmxOptions options = {});

class AmxBackend : public attention::HostPagedBackend {
 public:
  explicit AmxBackend(const attention::BackendContext& ctx, AmxOptions options = {});
  /// What the header lists as supported.
  static attention::BackendCapabilities static_capabilities();
};

/// Registers "amx" (every build with oneDNN); its factory builds AmxBackend(ctx, options).
void register_amx_backend(attention::BackendRegistry& registry, AmxOptions options = {});

}  // namespace pagoda::backends
