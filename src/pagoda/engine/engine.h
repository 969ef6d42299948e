#pragma once
/// Engine: the serving loop between the Scheduler and the ModelWorker (ARCHITECTURE §1). It owns
/// the host-side memory bookkeeping (EngineMemory: PageAllocator, ReqToTokenTable, the prefix
/// cache: RadixCache, ChunkCache when disabled, or HiCache), the scheduler and the worker (which
/// owns the KV pool, the attention backend, the model's device weights, CUDA graphs and
/// sampling; a SpecWorker around it when speculating). One step, one loop:
///
///   Scheduler::schedule (memory) → WorkerBatch → ModelWorker::run (plan, layers, sample)
///   → sampled ids → complete / finish
///
/// Usage:
///   Engine engine(model, EngineConfig{.page_size = 16, .pool_tokens = 1 << 15});
///   RequestId id = engine.add_request({.prompt = ids, .max_new_tokens = 32});
///   engine.run_until_idle();
///   RequestOutput out = engine.output(id);
///
/// The plain loop is step() here; with EngineConfig::overlap the steps run through OverlapLoop
/// (overlap_loop.h). Both turn sampled ids into outputs and finishes through one
/// OutputProcessor (output_processor.h).
///
/// Thread rules: one thread drives an engine (with EngineConfig::overlap the worker runs the
/// steps on the OverlapLoop's StepThread). Contract: docs/design/engine.md.

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/cache/prefix_cache.h"
#include "pagoda/engine/memory.h"
#include "pagoda/engine/output_processor.h"
#include "pagoda/engine/overlap_loop.h"
#include "pagoda/engine/request.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/engine/spec_config.h"
#include "pagoda/engine/spec_worker.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/worker.h"
#include "pagoda/platform/platform.h"
#include "pagoda/tier/config.h"
#include "pagoda/tier/hicache.h"

namespace pagoda::engine {

/// Whether the window layers keep their KV in the sliding-window pool (docs/design/engine.md
/// §SWA).
enum class SwaPoolMode : uint8_t {
  kAuto,  ///< on the CPU: on for a model with windowed layers unless speculation, hicache, the
          ///< overlap scheduler or a custom worker (tensor parallelism) is asked for; on the GPU
          ///< off (SWA steps run without CUDA graphs yet)
  kOn,    ///< on (on the GPU without CUDA graphs); refuses a model without windowed layers and
          ///< those combinations
  kOff,   ///< the full pool for every layer, the window as a mask
};

struct EngineConfig {
  int32_t page_size = 16;
  /// KV pool capacity in tokens (rounded down to whole pages; page 0 is extra). 0: sized from
  /// memory by kv_cache_memory or mem_fraction_static (exactly one of the three is given;
  /// docs/design/engine.md "Pool sizing").
  int64_t pool_tokens = 32768;
  /// The KV pools' bytes together (vLLM's kv_cache_memory_bytes); 0: not this way.
  int64_t kv_cache_memory = 0;
  /// SGLang's --mem-fraction-static in (0, 1): the weights and the KV pools together take this
  /// fraction of the device's memory (engine/pool_sizing.h); 0: not this way. The engine's own
  /// worker only (a custom worker, tensor parallelism, gives pool_tokens).
  double mem_fraction_static = 0;
  /// With an SWA pool sized from memory and swa_pool_tokens 0: SWA tokens per full-pool token,
  /// in (0, 1] (SGLang's swa_full_tokens_ratio).
  double swa_full_tokens_ratio = 0.8;
  /// Longest request (prompt + output); 0 = the model's max_position_embeddings.
  int32_t max_context_len = 0;
  /// Share KV between requests through the radix tree (false: ChunkCache, no sharing). A hybrid
  /// model's tree also keeps state snapshots (cache::MambaRadixCache).
  bool radix_cache = true;
  /// Hybrid models (Mamba2 layers): the state pool's slots, the running requests', the radix
  /// cache's snapshots and a speculative round's draft nodes together (SGLang's
  /// --max-mamba-cache-size); 0 = max_running_requests, as many again with the radix cache (and
  /// again at page > 1: each request's aligned state), and max_running_requests ×
  /// spec.num_draft_tokens more when speculating.
  int32_t max_mamba_cache_size = 0;
  SchedulerConfig scheduler{};
  /// Attention backend names (empty = the platform's default), a hybrid model's linear-layer
  /// backend (backend.linear; empty = the attention selection's) and the kernel variants'
  /// options (backend.kernels: backends/kernel_options.h).
  backends::BackendSelection backend{};
  /// Run every check_integrity() after each step (tests).
  bool check_integrity = false;
  /// With a CUDA backend (capabilities().device == "cuda"): capture decode steps into CUDA
  /// graphs per batch-size bucket (cuda_graph_batch_sizes(max_running_requests)) and replay
  /// them. Ignored on the host path, and for a hybrid model (Mamba2 layers), whose steps run
  /// eagerly (no linear-attention backend has graph hooks yet).
  bool cuda_graph = true;
  /// MLA models: extend steps in the expanded form where it applies, or always absorbed
  /// (model::MlaPrefill; --mla-prefill).
  model::MlaPrefill mla_prefill = model::MlaPrefill::kAuto;
  /// MLA models' expanded form: keys per window (a step of more keys attends to them in windows
  /// merged by LSE); 0 = as many as 1 GiB of key scratch holds (--mla-window-keys).
  int64_t mla_window_keys = 0;
  /// Weight and activation dtype; nullopt = default_model_dtype (f32 on the CPU; bf16, or the
  /// checkpoint's f16, on CUDA). The CPU computes in f32 only.
  std::optional<DType> dtype{};
  /// KV cache dtype; nullopt = the model dtype. fp8 (e4m3 / e5m2) uses per-layer scales of 1.
  std::optional<DType> kv_dtype{};
  /// The CPU model's GEMMs (model_ops.h CpuGemm; --cpu-gemm): OpenBLAS on f32 weights, or
  /// oneDNN on bf16 weights. Only the CPU platform takes a mode other than kOpenBlas.
  model::CpuGemm cpu_gemm = model::CpuGemm::kOpenBlas;
  /// Speculative decoding (off by default): the worker becomes a SpecWorker (spec_worker.h)
  /// around the target's. Decode-only steps speculate; steps with a prefill run as usual (and
  /// the drafter follows them).
  SpecConfig spec{};
  /// Hierarchical KV cache (docs/design/tier.md): off unless a host pool size is given. Needs
  /// the radix cache, the default worker (no tensor parallelism) and no draft model or EAGLE
  /// head (their KV pools would miss the pages loaded back).
  tier::HiCacheConfig hicache{};
  SwaPoolMode swa_pool = SwaPoolMode::kAuto;
  /// SWA pool capacity in tokens (whole pages); 0 = as many as pool_tokens. It must hold the
  /// largest extend (a prefill chunk) plus every running request's window.
  int64_t swa_pool_tokens = 0;
  /// Overlap loop (docs/design/engine.md "Overlap"): the worker runs step N on its own thread
  /// while the engine schedules step N + 1 (whose decode inputs are N's ids, resolved by the
  /// worker) and then finishes step N's requests, one step late. Outputs are those of the plain
  /// loop. Not with speculative decoding, the hierarchical cache or disaggregation (hold_kv,
  /// EngineTransfer).
  bool overlap = false;

  /// Throws Error(kInvalidArgument) naming the first bad field (page size, pool, context,
  /// scheduler limits, speculation, kernel options), Error(kUnsupported) for a backend name this
  /// build does not register or a page size its capabilities exclude. Cheap: callers check
  /// before loading a model or building anything.
  void validate() const;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t extend_steps = 0;
  int64_t decode_steps = 0;
  int64_t mixed_steps = 0;
  int64_t computed_tokens = 0;   ///< query tokens run through the model
  int64_t generated_tokens = 0;  ///< tokens sampled
  int64_t pool_tokens = 0;       ///< usable pool capacity
  bool device_path = false;      ///< the model runs on the GPU (CUDA path)
  int cuda_graphs = 0;           ///< captured decode graphs (buckets)
  int64_t cuda_graph_steps = 0;  ///< decode steps served by a graph replay
  int64_t aborted_by_user = 0;   ///< requests ended by Engine::abort
  DType dtype = DType::kF32;     ///< the model's compute dtype
  DType kv_dtype = DType::kF32;
  int64_t spec_steps = 0;        ///< speculative rounds (each one verify forward; no decode_steps)
  spec::AcceptStats spec;        ///< acceptance counters of those rounds
  int64_t spec_graph_steps = 0;  ///< verify forwards served by a graph replay
  int64_t draft_forwards = 0;    ///< draft-model forwards of speculative rounds (draft steps)
  int64_t draft_graph_steps = 0; ///< those served by a graph replay (verify or decode graph)
  SpecTimes spec_time;
  SchedulerStats scheduler;
  cache::CacheStats cache;
  /// Load at the time of the snapshot (servers export these as gauges).
  int64_t num_waiting = 0;       ///< requests queued (new or retracted)
  int64_t num_running = 0;       ///< requests prefilling or decoding
  int64_t pages_total = 0;       ///< usable KV pages
  int64_t pages_free = 0;        ///< pages on the free list
  int64_t pages_cached = 0;      ///< pages held by the prefix cache (evictable or locked)
  int64_t swa_pages_total = 0;   ///< SWA pool pages (0: the window layers use the full pool)
  int64_t swa_pages_free = 0;
  int64_t kv_bytes = 0;          ///< bytes the KV pool allocated (with the SWA pool: its full
                                 ///< layers only)
  int64_t swa_kv_bytes = 0;      ///< bytes the SWA pool allocated (its window layers; 0: none)
  bool hicache = false;          ///< the hierarchical cache is on (tier below)
  tier::TierStats tier;          ///< hits per tier, copies, host pool (hicache only)
  /// Reused prompt tokens / prompt tokens requested at admission.
  double prefix_hit_rate() const {
    return scheduler.fill_tokens == 0 ? 0.0
                                      : static_cast<double>(scheduler.cached_tokens) /
                                            static_cast<double>(scheduler.fill_tokens);
  }
};

/// The attention backend a plain run uses: the platform's default when this build registers it,
/// else "reference" (always registered).
std::string default_backend_name(const platform::Platform& platform);

/// The platform a backend selection runs on: the GPU when it names "cuda" (prefill, decode or
/// attention), or names nothing and a GPU is present (its default backend is then "cuda");
/// the CPU otherwise. Error(kUnsupported) when "cuda" is named but this build or machine has
/// no GPU.
std::unique_ptr<platform::Platform> make_platform_for(const backends::BackendSelection& selection);

/// What a WorkerFactory builds: the worker and, when it runs other ranks whose device pools
/// hold shards of its pages (tensor parallelism), the mirror the hierarchical cache sends its
/// page copies through (owned by the worker, usually the worker itself; null otherwise). A
/// factory that returns just the worker converts.
struct BuiltWorker {
  BuiltWorker(std::unique_ptr<model::ModelWorker> w,  // NOLINT(google-explicit-constructor)
              tier::TierPeers* peers = nullptr)
      : worker(std::move(w)), tier_peers(peers) {}
  std::unique_ptr<model::ModelWorker> worker;
  tier::TierPeers* tier_peers;
};

/// Builds the worker an engine computes with, from the model, the compute dtype, the worker
/// settings the engine derived from its config and the engine's request table (which the worker's
/// backend reads). The default builds a LlamaWorker on the engine's platform; tensor parallelism
/// (engine/tp.h) builds a TpLeaderWorker, also its tier peers.
using WorkerFactory = std::function<BuiltWorker(const model::LlamaModel& model, DType dtype,
                                                const model::WorkerConfig& config,
                                                kv::ReqToTokenTable& table)>;

/// The model ops for `platform` in `dtype` (CPU: f32 only, GEMMs per `cpu_gemm`; CUDA: f32,
/// f16, bf16, and cpu_gemm must be kOpenBlas). Throws Error(kUnsupported) naming what would work.
std::unique_ptr<model::ModelOps> make_model_ops(platform::Platform& platform, DType dtype,
                                                model::CpuGemm cpu_gemm = model::CpuGemm::kOpenBlas);

/// The dtype a plain run computes in: f32 on the CPU; on CUDA the checkpoint's f16 when its
/// weights are f16, else bf16 (an f32 checkpoint runs in bf16 unless f32 is asked for).
DType default_model_dtype(const platform::Platform& platform, const model::ModelConfig& model);

class Engine;

/// Prefill–decode disaggregation hooks of an Engine (docs/design/pd.md), from Engine::transfer():
/// a view of the engine, valid while it lives. Call between steps, on the engine's thread.
class EngineTransfer {
 public:
  explicit EngineTransfer(Engine& engine) : engine_(engine) {}
  /// Decode side: validates and records a request like Engine::add_request, but does not queue
  /// it: its prompt KV comes from a prefill server. preallocate() reserves its memory.
  RequestId add_request(GenerateRequest request);
  /// Decode side: reserves the row and prompt pages of a request from add_request like an
  /// admission (Scheduler::preallocate; the prefix cache's match, output(id).cached_tokens long
  /// and page-aligned, is reused); false when they do not fit now (retry later). Throws
  /// kFailedPrecondition for a request in another state.
  bool preallocate(RequestId id);
  /// The pages of positions [0, prompt_len) of a preallocated or held request, in order (the
  /// last one may be partly used). Throws kFailedPrecondition when it holds no KV.
  std::vector<PageId> prompt_pages(RequestId id) const;
  /// Decode side: the prompt KV of a preallocated request is in its pages; `first_token` (sampled
  /// by the prefill server) becomes its first output token and it joins the running requests.
  /// Returns true when that token already finishes it (EOS, max_new_tokens 1, context).
  /// Throws kInvalidArgument for a token outside the vocabulary, kFailedPrecondition for a
  /// request that is not preallocated (nothing changed).
  bool commit(RequestId id, int32_t first_token);
  /// Prefill side: releases the row and KV that a finished hold_kv request still holds (its KV
  /// goes to the prefix cache). Throws kFailedPrecondition when it holds none.
  void release_kv(RequestId id);

 private:
  Engine& engine_;
};

class Engine {
 public:
  /// Builds the memory, cache and backend for `model` (which must outlive the engine). Uses
  /// `platform` when given (it must outlive the engine), else the CPU platform. Throws Error on a
  /// bad config or a backend that cannot serve the model (the message names what would work).
  /// `make_worker` replaces the default LlamaWorker (tensor parallelism); it must build a worker
  /// over `platform` (or the CPU when null).
  Engine(model::LlamaModel& model, const EngineConfig& config,
         platform::Platform* platform = nullptr, const WorkerFactory& make_worker = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request. Throws Error (engine unchanged) for an empty prompt, a token id outside
  /// the vocabulary, max_new_tokens < 1, bad sampling parameters, a prompt that does not leave
  /// room for one output token in the context (kInvalidArgument), or a prompt larger than the
  /// whole KV pool (kResourceExhausted).
  RequestId add_request(GenerateRequest request);
  /// Runs one step; an idle step (nothing to do) returns an empty StepOutput.
  StepOutput step();
  /// Steps until no request is waiting or running.
  void run_until_idle();
  /// Ends a waiting or running request now (FinishReason::kAbort) and frees everything it holds:
  /// its queue entry, request row, lock and KV pages (computed KV goes to the prefix cache).
  /// Returns false (nothing changed) when the request has already finished. Throws kOutOfRange
  /// for an unknown id. Call between steps.
  bool abort(RequestId id);
  bool has_work() const {
    return scheduler_->has_work() || (overlap_ != nullptr && overlap_->busy());
  }

  /// The prefill–decode disaggregation hooks (EngineTransfer, docs/design/pd.md).
  EngineTransfer transfer() { return EngineTransfer(*this); }

  /// Installs (or clears, with nullptr) the logits observer.
  void set_logits_observer(LogitsObserver observer) {
    outputs_->set_observer(std::move(observer));
  }

  /// Snapshot of a request (any state). Throws kOutOfRange for an unknown id.
  RequestOutput output(RequestId id) const;
  /// Forgets a finished request (its output can no longer be read). Throws when not finished.
  void release(RequestId id);

  EngineStats stats() const;
  /// The host-side memory bookkeeping (allocator, request table, prefix cache) and its audits:
  /// leaked_pages(), leaked_rows(), leaked_states(), idle_pages_accounted(), check_integrity(),
  /// drain_prefix_cache() ... (memory.h).
  EngineMemory& memory() { return *memory_; }

  int32_t max_context_len() const { return max_context_len_; }
  /// The worker that computes the steps (a SpecWorker around the target's when speculating);
  /// worker().backend_name() is the attention backend's name ("cpu", "reference", "hybrid(...)").
  model::ModelWorker& worker() { return *worker_; }

 private:
  friend class EngineTransfer;
  /// Validates `request` (add_request's checks) and records it (not queued).
  Req& create_request(GenerateRequest request);
  model::LlamaModel* model_;
  EngineConfig config_;
  std::unique_ptr<platform::Platform> own_platform_;
  platform::Platform* platform_;
  int32_t max_context_len_;
  std::unique_ptr<EngineMemory> memory_;
  std::unique_ptr<model::ModelWorker> worker_;
  const SpecWorker* spec_ = nullptr;  ///< worker_ when speculating (its counters)
  std::unique_ptr<Scheduler> scheduler_;
  model::WorkerBatch batch_;  ///< the plain loop's, reused per step
  std::unordered_map<RequestId, std::unique_ptr<Req>> reqs_;
  RequestId next_id_ = 0;
  EngineStats stats_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::unique_ptr<OverlapLoop> overlap_;  ///< EngineConfig::overlap only; last: it stops first
};

}  // namespace pagoda::engine
