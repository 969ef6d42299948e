#include "pagoda/engine/engine.h"

#include <algorithm>
#include <chrono>

#include <fmt/ranges.h>

#include "pagoda/cache/chunk_cache.h"
#include "pagoda/cache/mamba_radix_cache.h"
#include "pagoda/cache/radix_cache.h"
#include "pagoda/cache/swa_radix_cache.h"
#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/pool_sizing.h"
#include "pagoda/model/llama_worker.h"
#ifdef PAGODA_HAVE_CUDA_MODEL
#include "pagoda/model/cuda/cuda_ops.h"
#endif
#ifdef PAGODA_HAVE_CUDA_BACKEND
#include "pagoda/platform/cuda/cuda_platform.h"
#endif

namespace pagoda::engine {

using attention::ForwardMode;

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kContext: return "context";
    case FinishReason::kError: return "error";
    case FinishReason::kAbort: return "abort";
  }
  return "?";
}

Req::Req(RequestId rid, GenerateRequest&& g, double now)
    : id(rid),
      prompt_len(static_cast<int32_t>(g.prompt.size())),
      max_new_tokens(g.max_new_tokens),
      ignore_eos(g.ignore_eos),
      hold_kv(g.hold_kv),
      sampling(g.sampling),
      logit_processing(std::move(g.logit_processing)),
      logprobs(g.logprobs),
      constraint(std::move(g.constraint)) {
  cache.tokens = std::move(g.prompt);
  cache.extra_key = std::move(g.extra_key);
  out.id = rid;
  out.prompt_len = prompt_len;
  out.arrival_s = now;
}

std::string default_backend_name(const platform::Platform& platform) {
  attention::BackendRegistry registry;
  backends::register_builtin_backends(registry);
  const std::string name = platform.default_attention_backend();
  return registry.contains(name) ? name : "reference";
}

std::unique_ptr<platform::Platform> make_platform_for(const backends::BackendSelection& sel) {
  const bool named = !sel.attention.empty() || !sel.prefill.empty() || !sel.decode.empty();
  const bool wants_cuda = sel.attention == "cuda" || sel.prefill == "cuda" || sel.decode == "cuda";
#ifdef PAGODA_HAVE_CUDA_BACKEND
  if (wants_cuda || !named) {
    std::unique_ptr<platform::Platform> gpu = platform::make_cuda_platform();
    if (gpu != nullptr) return gpu;
    PAGODA_REQUIRE(!wants_cuda, kUnsupported,
                   "backend 'cuda' needs a GPU and this machine has none; use 'cpu' or "
                   "'reference'");
  }
#else
  (void)named;
  PAGODA_REQUIRE(!wants_cuda, kUnsupported,
                 "backend 'cuda' is not in this build (configure with -DPAGODA_CUDA=ON); use "
                 "'cpu' or 'reference'");
#endif
  return platform::make_cpu_platform();
}

namespace {

int32_t context_len_for(const model::LlamaModel& model, const EngineConfig& c) {
  const int32_t model_max = model.config().max_position_embeddings;
  PAGODA_REQUIRE(c.max_context_len >= 0, kInvalidArgument, "max_context_len must be >= 0");
  return c.max_context_len > 0 ? std::min(c.max_context_len, model_max) : model_max;
}

Req& find_req(const std::unordered_map<RequestId, std::unique_ptr<Req>>& reqs, RequestId id) {
  auto it = reqs.find(id);
  PAGODA_REQUIRE(it != reqs.end(), kOutOfRange, "unknown request id {}", id);
  return *it->second;
}

}  // namespace

DType default_model_dtype(const platform::Platform& platform, const model::ModelConfig& model) {
  if (platform.kind() == platform::PlatformKind::kCpu) return DType::kF32;
  return model.weights_dtype == DType::kF16 ? DType::kF16 : DType::kBF16;
}

namespace {

/// A hybrid model's state pool slots (EngineConfig::max_mamba_cache_size).
int32_t state_pool_slots(const EngineConfig& c) {
  if (c.max_mamba_cache_size > 0) return c.max_mamba_cache_size;
  const int32_t running = c.scheduler.max_running_requests;
  // A running request's own (cache::request_state_slots), as many radix snapshots, and a
  // speculative round's draft nodes.
  return running * (cache::request_state_slots(c.radix_cache, c.page_size) +
                    (c.radix_cache ? 1 : 0)) +
         (c.spec.mode == SpecMode::kNone ? 0 : running * c.spec.num_draft_tokens);
}

/// The pools' sizes: pool_tokens as given (the SWA pool: swa_pool_tokens, or as many), or from
/// a memory budget (kv_cache_memory, or mem_fraction_static of the platform's memory, less the
/// weights a device worker has still to upload) split by pool_sizing.h.
PoolSizes engine_pool_sizes(const model::LlamaModel& model, const EngineConfig& c,
                            const platform::Platform& platform, DType dtype, DType kv_dtype,
                            bool swa, bool custom_worker) {
  if (c.pool_tokens > 0)
    return {.pool_tokens = c.pool_tokens,
            .swa_pool_tokens = !swa ? 0 : c.swa_pool_tokens > 0 ? c.swa_pool_tokens : c.pool_tokens};
  PAGODA_REQUIRE(!custom_worker, kUnsupported,
                 "sizing the KV pool from memory (kv_cache_memory, mem_fraction_static) covers "
                 "the engine's own worker: with a custom worker (tensor parallelism) give "
                 "pool_tokens");
  using Kind = model::LlamaModel::PoolLayers;
  auto bytes_per_token = [&](Kind kind) {
    kv::KvPoolConfig pc = model.kv_pool_config(1, c.page_size, kind);
    pc.dtype = kv_dtype;
    return kv::kv_bytes_per_token(pc);
  };
  PoolBudget b{.page_size = c.page_size,
               .full_bytes_per_token = bytes_per_token(swa ? Kind::kFull : Kind::kAll),
               .swa_bytes_per_token = swa ? bytes_per_token(Kind::kWindow) : 0,
               .swa_full_tokens_ratio = c.swa_full_tokens_ratio,
               .swa_pool_tokens = c.swa_pool_tokens};
  // The CPU model computes on the host weights already loaded; a device worker uploads its
  // copy after the pools are allocated.
  const int64_t pending = platform.kind() == platform::PlatformKind::kCpu
                              ? 0
                              : model.weight_elements() * static_cast<int64_t>(dtype_size(dtype));
  b.budget_bytes = c.kv_cache_memory > 0
                       ? c.kv_cache_memory
                       : kv_budget_from_fraction(platform.memory_info(), c.mem_fraction_static,
                                                 pending);
  if (model.config().has_linear_layers()) {  // the worker's state pool comes out of the budget
    // (the running requests' slots and the radix cache's snapshots)
    const int64_t states = int64_t{state_pool_slots(c)} *
                           model.config().num_linear_layers() *
                           model::mamba2_shape(model.config()).state_shape().bytes();
    PAGODA_REQUIRE(states < b.budget_bytes, kResourceExhausted,
                   "the KV budget of {} bytes does not cover the hybrid state pool ({} bytes for "
                   "{} state slots)",
                   b.budget_bytes, states, state_pool_slots(c));
    b.budget_bytes -= states;
  }
  return size_pools(b);
}

}  // namespace

std::unique_ptr<model::ModelOps> make_model_ops(platform::Platform& platform, DType dtype,
                                                model::CpuGemm cpu_gemm) {
  if (platform.kind() == platform::PlatformKind::kCpu)
    return model::make_cpu_ops(platform, dtype, cpu_gemm);
  PAGODA_REQUIRE(cpu_gemm == model::CpuGemm::kOpenBlas, kUnsupported,
                 "--cpu-gemm {} is for the CPU model; this model runs on platform '{}'",
                 model::cpu_gemm_name(cpu_gemm), platform.name());
#ifdef PAGODA_HAVE_CUDA_MODEL
  return model::make_cuda_ops(platform, dtype);
#else
  throw_error(ErrorCode::kUnsupported,
              "the model cannot run on platform '{}': this build has no CUDA model path",
              platform.name());
#endif
}

void EngineConfig::validate() const {
  PAGODA_REQUIRE(page_size >= 1, kInvalidArgument, "page size must be >= 1 (got {})", page_size);
  PAGODA_REQUIRE((pool_tokens > 0) + (kv_cache_memory > 0) + (mem_fraction_static > 0) == 1 &&
                     pool_tokens >= 0 && kv_cache_memory >= 0 && mem_fraction_static >= 0,
                 kInvalidArgument,
                 "give exactly one KV pool size: pool_tokens ({}), kv_cache_memory ({} bytes) or "
                 "mem_fraction_static ({})",
                 pool_tokens, kv_cache_memory, mem_fraction_static);
  if (pool_tokens > 0) {
    const int64_t num_pages = pool_tokens / page_size;
    PAGODA_REQUIRE(num_pages >= 1 && num_pages < (int64_t{1} << 30) / page_size, kInvalidArgument,
                   "pool of {} tokens at page size {} is out of range", pool_tokens, page_size);
  }
  PAGODA_REQUIRE(mem_fraction_static < 1, kInvalidArgument,
                 "mem_fraction_static must be in (0, 1) (got {})", mem_fraction_static);
  PAGODA_REQUIRE(swa_full_tokens_ratio > 0 && swa_full_tokens_ratio <= 1, kInvalidArgument,
                 "swa_full_tokens_ratio must be in (0, 1] (got {})", swa_full_tokens_ratio);
  PAGODA_REQUIRE(max_context_len >= 0, kInvalidArgument, "max_context_len must be >= 0");
  PAGODA_REQUIRE(max_mamba_cache_size >= 0, kInvalidArgument,
                 "max_mamba_cache_size must be >= 0 (got {})", max_mamba_cache_size);
  scheduler.validate(page_size);
  spec.validate();
  hicache.validate();
  PAGODA_REQUIRE(swa_pool_tokens >= 0, kInvalidArgument, "swa_pool_tokens must be >= 0 (got {})",
                 swa_pool_tokens);
  if (swa_pool == SwaPoolMode::kOn) {
    PAGODA_REQUIRE(spec.mode == SpecMode::kNone, kUnsupported,
                   "the SWA pool (--swa-pool on) does not support speculative decoding (--spec "
                   "{}) yet: turn one of them off",
                   spec_mode_name(spec.mode));
    PAGODA_REQUIRE(!hicache.enabled(), kUnsupported,
                   "the SWA pool (--swa-pool on) does not support the hierarchical cache "
                   "(hicache) yet: turn one of them off");
    PAGODA_REQUIRE(!overlap, kUnsupported,
                   "the SWA pool (--swa-pool on) does not run with the overlap scheduler "
                   "(--overlap on) yet: turn one of them off");
  }
  PAGODA_REQUIRE(!overlap || spec.mode == SpecMode::kNone, kUnsupported,
                 "the overlap scheduler (overlap on) does not support speculative decoding "
                 "(speculative mode '{}'): turn one of them off",
                 spec_mode_name(spec.mode));
  if (hicache.enabled()) {
    PAGODA_REQUIRE(radix_cache, kInvalidArgument,
                   "the hierarchical cache (hicache) needs the radix cache (radix_cache off)");
    PAGODA_REQUIRE(spec.mode == SpecMode::kNone || spec.mode == SpecMode::kNgram, kUnsupported,
                   "the hierarchical cache (hicache) does not support speculative mode '{}' yet: "
                   "its draft KV pool would miss the pages loaded back (use none or ngram)",
                   spec_mode_name(spec.mode));
  }
  // Backend names and the page sizes they declare, checked here so a bad choice fails before the
  // pools, the worker or the model's device copy are built (the rest of a backend's
  // requirements depend on the model and are checked when the worker builds it).
  backend.kernels.validate();
  const std::string gemm_why = model::cpu_gemm_unavailable(cpu_gemm);
  PAGODA_REQUIRE(gemm_why.empty(), kUnsupported, "--cpu-gemm {}: {}",
                 model::cpu_gemm_name(cpu_gemm), gemm_why);
  attention::BackendRegistry registry;
  backends::register_builtin_backends(registry);
  for (const std::string* name : {&backend.attention, &backend.prefill, &backend.decode}) {
    if (name->empty()) continue;
    PAGODA_REQUIRE(registry.contains(*name), kUnsupported,
                   "attention backend '{}' is not in this build (have: {})", *name,
                   fmt::join(registry.names(), ", "));
    const attention::BackendCapabilities& caps = registry.capabilities(*name);
    PAGODA_REQUIRE(caps.page_sizes.empty() || std::find(caps.page_sizes.begin(),
                                                        caps.page_sizes.end(),
                                                        page_size) != caps.page_sizes.end(),
                   kUnsupported, "attention backend '{}' does not support page size {} (it takes {})",
                   *name, page_size, fmt::join(caps.page_sizes, ", "));
  }
  PAGODA_REQUIRE(backend.linear.empty() || registry.contains_linear(backend.linear), kUnsupported,
                 "linear-attention backend '{}' (--linear-backend) is not in this build (have: {})",
                 backend.linear, fmt::join(registry.linear_names(), ", "));
}

Engine::Engine(model::LlamaModel& model, const EngineConfig& config, platform::Platform* platform,
               const WorkerFactory& make_worker)
    : model_(&model),
      config_(config),
      platform_(platform),
      max_context_len_(context_len_for(model, config)) {
  const auto start = std::chrono::steady_clock::now();  // the time base of RequestOutput
  config.validate();
  if (platform_ == nullptr) {
    own_platform_ = platform::make_cpu_platform();
    platform_ = own_platform_.get();
  }
  const DType dtype = config.dtype.value_or(default_model_dtype(*platform_, model.config()));
  const DType kv_dtype = config.kv_dtype.value_or(dtype);
  // Hybrid models (Mamba2 layers: Bamba) keep a recurrent state per request in the worker's
  // state pool (docs/design/state_pool.md), on the CPU or the GPU (there without CUDA graphs:
  // the worker runs their steps eagerly); what cannot follow that state yet is refused.
  const bool hybrid = model.config().has_linear_layers();
  if (hybrid) {
    const std::string_view arch = model::hf_architecture_name(model.config().family);
    PAGODA_REQUIRE(config.spec.mode == SpecMode::kNone || config.spec.mode == SpecMode::kNgram,
                   kUnsupported,
                   "{} (hybrid state pool) speculates with n-gram drafts only (speculative mode "
                   "'{}'): a draft model or EAGLE head would need Mamba2 states of its own",
                   arch, spec_mode_name(config.spec.mode));
    PAGODA_REQUIRE(!config.hicache.enabled(), kUnsupported,
                   "{} (hybrid state pool) does not support the hierarchical cache (hicache): "
                   "the host tier keeps no Mamba2 states",
                   arch);
    PAGODA_REQUIRE(!config.overlap, kUnsupported,
                   "{} (hybrid state pool) does not run with the overlap scheduler (overlap "
                   "on): a decode it takes back would already have advanced the Mamba2 state",
                   arch);
    PAGODA_REQUIRE(!make_worker, kUnsupported,
                   "{} (hybrid state pool) does not run with a custom worker (tensor "
                   "parallelism)",
                   arch);
  }
  int swa_window = -1;  // the largest window of the model's layers (FlashInfer convention)
  for (int l = 0; l < model.config().num_layers; ++l)
    swa_window = std::max(swa_window, model.config().window_of(l));
  // The SWA pool runs on the CPU and the GPU (there without CUDA graphs: the worker runs its
  // steps eagerly, docs/design/engine.md §13).
  bool swa = config.swa_pool == SwaPoolMode::kOn;
  if (config.swa_pool == SwaPoolMode::kAuto)
    // On the GPU `auto` keeps one pool: SWA steps capture no CUDA graphs yet, and a default
    // that drops the decode graphs of every Gemma / Mistral engine costs short contexts more
    // than the pool saves; `on` trades the graphs for the memory.
    swa = swa_window >= 0 && config.spec.mode == SpecMode::kNone && !config.hicache.enabled() &&
          !config.overlap && !make_worker && platform_->kind() == platform::PlatformKind::kCpu;
  if (swa) {
    PAGODA_REQUIRE(swa_window >= 0, kInvalidArgument,
                   "the SWA pool (--swa-pool on) needs a model with sliding-window layers");
    PAGODA_REQUIRE(!make_worker, kUnsupported,
                   "the SWA pool (--swa-pool on) does not run with a custom worker (tensor "
                   "parallelism) yet: turn one of them off");
  }
  const PoolSizes sizes =
      engine_pool_sizes(model, config, *platform_, dtype, kv_dtype, swa, static_cast<bool>(make_worker));
  const int64_t num_pages = sizes.pool_tokens / config.page_size;
  memory_ = std::make_unique<EngineMemory>(static_cast<int32_t>(num_pages), config.page_size,
                                           config.scheduler.max_running_requests,
                                           max_context_len_);
  kv::PageAllocator& allocator = memory_->allocator();
  kv::ReqToTokenTable& table = memory_->table();
  if (swa) {
    const int64_t swa_pages = sizes.swa_pool_tokens / config.page_size;
    PAGODA_REQUIRE(swa_pages >= 1 && swa_pages <= num_pages, kInvalidArgument,
                   "SWA pool of {} tokens: needs 1 to {} pages of {} tokens",
                   sizes.swa_pool_tokens, num_pages, config.page_size);
    memory_->enable_swa(static_cast<int32_t>(swa_pages));
  }
  const model::WorkerConfig wc{
      .page_size = config.page_size,
      .num_pages = static_cast<int32_t>(num_pages),
      .kv_dtype = kv_dtype,
      .backend = config.backend,
      .mixed_batches = config.scheduler.mixed_batches,
      .cuda_graph = config.cuda_graph,
      .max_batch_size = config.scheduler.max_running_requests,
      .verify_graph_tokens = config.spec.worker_graph_tokens(config.scheduler.max_running_requests),
      .state_slots = hybrid ? state_pool_slots(config) : 0,
      .comm = nullptr,
      .swa = memory_->swa_pages(),
      .cpu_gemm = config.cpu_gemm,
      .mla_prefill = config.mla_prefill,
      .mla_window_keys = config.mla_window_keys};
  tier::TierPeers* tier_peers = nullptr;
  if (make_worker) {
    BuiltWorker built = make_worker(model, dtype, wc, table);
    worker_ = std::move(built.worker);
    tier_peers = built.tier_peers;
    PAGODA_REQUIRE(worker_ != nullptr, kInvalidArgument, "the worker factory returned no worker");
  } else {
    worker_ = std::make_unique<model::LlamaWorker>(model, make_model_ops(*platform_, dtype, wc.cpu_gemm),
                                                   wc,
                                                   table);
  }
  std::unique_ptr<cache::PrefixCache> cache;
  tier::HiCache* hicache = nullptr;
  if (config.hicache.enabled()) {
    // The host tier copies to and from the worker's pool, so it comes after the worker. A
    // worker that runs other ranks (tensor parallelism: rank 0's pool is one head shard) came
    // with the TierPeers that mirror every page copy to their pools.
    auto hi = std::make_unique<tier::HiCache>(allocator, table, worker_->kv_pool(), *platform_,
                                              config.hicache, tier::StorageFactory{}, tier_peers);
    hicache = hi.get();
    cache = std::move(hi);
  } else if (swa && config.radix_cache) {
    cache = std::make_unique<cache::SwaRadixCache>(*memory_->swa_pages(), &table, swa_window);
  } else if (swa) {
    cache = std::make_unique<cache::ChunkCache>(*memory_->swa_refs(), &table);
  } else if (config.radix_cache && hybrid) {
    // A hybrid model's hit needs the Mamba2 state at the match point: nodes keep snapshots.
    cache = std::make_unique<cache::MambaRadixCache>(allocator, table, *worker_->state_pool());
  } else if (config.radix_cache) {
    cache = std::make_unique<cache::RadixCache>(allocator, table);
  } else {
    cache = std::make_unique<cache::ChunkCache>(allocator, table);
  }
  scheduler_ = std::make_unique<Scheduler>(config.scheduler, allocator, table, *cache);
  if (hybrid) {
    kv::StatePool* states = worker_->state_pool();
    PAGODA_CHECK(states != nullptr, "the worker of a hybrid model has no state pool");
    scheduler_->use_state_pool(*states, dynamic_cast<cache::MambaRadixCache*>(cache.get()));
  }
  if (swa)
    scheduler_->use_swa(*memory_->swa_pages(),
                        dynamic_cast<cache::SwaRadixCache*>(cache.get()), swa_window);
  memory_->set_cache(std::move(cache), hicache,
                     EngineMemory::Owners{
                         .live_requests = [this] {
                           return static_cast<int64_t>(scheduler_->num_running() +
                                                       scheduler_->num_waiting() +
                                                       scheduler_->num_parked());
                         },
                         .request_private_pages =
                             [this] { return scheduler_->request_private_pages(); },
                         .live_rows = [this] {
                           int64_t live = 0;
                           for (const auto& [id, r] : reqs_) live += r->cache.req_slot.valid();
                           return live + (overlap_ != nullptr ? overlap_->held_rows() : 0);
                         },
                         .request_private_swa_pages =
                             [this] { return scheduler_->request_private_swa_pages(); },
                         .states = worker_->state_pool(),
                         .state_holders = [this] {
                           std::vector<int32_t> holders = scheduler_->request_state_slots();
                           if (const cache::MambaRadixCache* snaps = scheduler_->state_cache()) {
                             const std::vector<int32_t> held = snaps->state_slots();
                             holders.insert(holders.end(), held.begin(), held.end());
                           }
                           return holders;
                         }});
  if (config.spec.mode != SpecMode::kNone) {
    // With tensor parallelism the target runs sharded through the factory's worker; a draft
    // model or EAGLE head runs whole on this process's platform.
    auto spec = std::make_unique<SpecWorker>(
        std::move(worker_), model, config.spec, wc,
        [this, dtype, gemm = config.cpu_gemm] { return make_model_ops(*platform_, dtype, gemm); },
        SpecMemory{.allocator = &allocator,
                   .table = &table,
                   .reserve_tokens = [s = scheduler_.get()](int64_t n) {
                     return s->reserve_tokens(n);
                   }});
    spec_ = spec.get();
    worker_ = std::move(spec);
  }
  outputs_ = std::make_unique<OutputProcessor>(*scheduler_, model.config(), max_context_len_,
                                               stats_, start);
  if (config.overlap) {
    overlap_ = std::make_unique<OverlapLoop>(*scheduler_, *worker_, table, *outputs_, hicache);
    // The tier's copies that free or back up pages wait for the steps in flight first.
    if (hicache != nullptr)
      hicache->set_step_barrier([this] {
        if (overlap_ != nullptr) overlap_->step_barrier();
      });
  }
  stats_.pool_tokens = num_pages * config.page_size;
  stats_.dtype = dtype;
  stats_.kv_dtype = kv_dtype;
}

Engine::~Engine() {
  overlap_.reset();  // the step in flight ends before what it reads goes
  // The hierarchical cache finishes its copies into the worker's pool: it goes before the worker.
  scheduler_.reset();
  memory_->reset_cache();
}

RequestId Engine::add_request(GenerateRequest request) {
  Req& req = create_request(std::move(request));
  scheduler_->enqueue(&req);
  return req.id;
}

RequestId EngineTransfer::add_request(GenerateRequest request) {
  PAGODA_REQUIRE(engine_.config_.spec.mode == SpecMode::kNone, kUnsupported,
                 "a transferred (disaggregated) request needs speculative decoding off");
  PAGODA_REQUIRE(engine_.memory_->swa_pages() == nullptr, kUnsupported,
                 "a transferred (disaggregated) request needs the SWA pool off (--swa-pool off)");
  PAGODA_REQUIRE(!engine_.config_.overlap, kUnsupported,
                 "a transferred (disaggregated) request needs the overlap scheduler off");
  PAGODA_REQUIRE(!engine_.model_->config().has_linear_layers(), kUnsupported,
                 "a transferred (disaggregated) request is not supported on {} (the hybrid state "
                 "pool's Mamba2 states are not transferred)",
                 model::hf_architecture_name(engine_.model_->config().family));
  return engine_.create_request(std::move(request)).id;
}

bool EngineTransfer::preallocate(RequestId id) {
  Req& r = find_req(engine_.reqs_, id);
  PAGODA_REQUIRE(r.state == RequestState::kWaiting && !r.admitted_once, kFailedPrecondition,
                 "request {} is not a transfer request waiting for its pages", id);
  return engine_.scheduler_->preallocate(&r);
}

std::vector<PageId> EngineTransfer::prompt_pages(RequestId id) const {
  const Req& r = find_req(engine_.reqs_, id);
  PAGODA_REQUIRE(engine_.memory_->swa_pages() == nullptr, kUnsupported,
                 "the prompt KV of a model on the SWA pool cannot be transferred yet (its window "
                 "layers are in the second pool): run with --swa-pool off");
  PAGODA_REQUIRE(r.cache.req_slot.valid() && r.kv_len >= r.prompt_len, kFailedPrecondition,
                 "request {} holds no prompt KV", id);
  const auto row = engine_.memory_->table().row(r.cache.req_slot);
  std::vector<PageId> pages;
  for (int64_t pos = 0; pos < r.prompt_len; pos += engine_.config_.page_size)
    pages.push_back(PageId{static_cast<int32_t>(row[pos] / engine_.config_.page_size)});
  return pages;
}

bool EngineTransfer::commit(RequestId id, int32_t first_token) {
  Req& r = find_req(engine_.reqs_, id);
  const model::ModelConfig& mc = engine_.model_->config();
  PAGODA_REQUIRE(first_token >= 0 && first_token < mc.vocab_size, kInvalidArgument,
                 "first token {} outside the vocabulary [0, {})", first_token, mc.vocab_size);
  PAGODA_REQUIRE(r.state == RequestState::kPrefilling && r.num_output() == 0 &&
                     r.kv_len == r.prompt_len,
                 kFailedPrecondition, "request {} is not waiting for its transferred KV", id);
  engine_.scheduler_->complete_transfer(&r);
  r.cache.tokens.push_back(first_token);
  ++engine_.stats_.generated_tokens;
  r.out.first_token_s = engine_.outputs_->now();
  bool done = false;
  if (check_finished(r, first_token, mc.eos_token_id, engine_.max_context_len_)) {
    engine_.scheduler_->finish(&r);
    r.out.finish_s = r.out.first_token_s;
    done = true;
  }
  if (engine_.config_.check_integrity) engine_.memory_->check_integrity();
  return done;
}

void EngineTransfer::release_kv(RequestId id) {
  Req& r = find_req(engine_.reqs_, id);
  PAGODA_REQUIRE(r.out.kv_held, kFailedPrecondition, "request {} holds no KV to release", id);
  engine_.scheduler_->release_held(&r);
  r.out.kv_held = false;
  if (engine_.config_.check_integrity) engine_.memory_->check_integrity();
}

Req& Engine::create_request(GenerateRequest request) {
  const auto& mc = model_->config();
  const int64_t len = static_cast<int64_t>(request.prompt.size());
  PAGODA_REQUIRE(len > 0, kInvalidArgument, "empty prompt");
  for (int32_t id : request.prompt)
    PAGODA_REQUIRE(id >= 0 && id < mc.vocab_size, kInvalidArgument,
                   "prompt token id {} outside the vocabulary [0, {})", id, mc.vocab_size);
  PAGODA_REQUIRE(request.max_new_tokens >= 1, kInvalidArgument,
                 "max_new_tokens must be >= 1 (got {})", request.max_new_tokens);
  request.sampling.validate();
  request.logit_processing.validate(mc.vocab_size);
  PAGODA_REQUIRE(request.logprobs >= -1 && request.logprobs <= model::kMaxLogprobs &&
                     request.logprobs <= mc.vocab_size,
                 kInvalidArgument, "logprobs {} outside [-1, {}]", request.logprobs,
                 model::kMaxLogprobs);
  PAGODA_REQUIRE((!request.logit_processing.active() && request.logprobs < 0) ||
                     config_.spec.mode == SpecMode::kNone,
                 kUnsupported,
                 "logit_bias, penalties and logprobs are not supported with speculative decoding");
  PAGODA_REQUIRE(request.constraint == nullptr || config_.spec.mode == SpecMode::kNone,
                 kUnsupported, "structured output is not supported with speculative decoding");
  PAGODA_REQUIRE(!request.hold_kv || !config_.overlap, kUnsupported,
                 "hold_kv (a disaggregated prefill) needs the overlap scheduler off");
  PAGODA_REQUIRE(!request.hold_kv || !mc.has_linear_layers(), kUnsupported,
                 "hold_kv (a disaggregated prefill) is not supported on {} (the hybrid state "
                 "pool's Mamba2 states are not transferred)",
                 model::hf_architecture_name(mc.family));
  PAGODA_REQUIRE(len < max_context_len_, kInvalidArgument,
                 "prompt of {} tokens does not fit the context of {} tokens (it needs room for "
                 "one output token)",
                 len, max_context_len_);
  PAGODA_REQUIRE(len <= stats_.pool_tokens, kResourceExhausted,
                 "prompt of {} tokens is larger than the whole KV pool ({} tokens)", len,
                 stats_.pool_tokens);
  const RequestId id = next_id_++;
  auto req = std::make_unique<Req>(id, std::move(request), outputs_->now());
  Req& ref = *req;
  reqs_.emplace(id, std::move(req));
  return ref;
}

StepOutput Engine::step() {
  if (overlap_ != nullptr) {
    StepOutput out = overlap_->step();
    if (config_.check_integrity) memory_->check_integrity();
    return out;
  }
  StepOutput out;
  ScheduledStep s = scheduler_->schedule();
  outputs_->take_aborted(s, out);
  if (s.empty()) return out;

  outputs_->build_batch(s, batch_);
  // The hierarchical cache's queued copies start now; layer l waits only for its own pages.
  const tier::ForwardScope forward(memory_->hicache());
  const model::WorkerOutput result = worker_->run(batch_);
  // A worker that ran the step otherwise (a speculative round) says so.
  out.mode = result.mode != ForwardMode::kIdle ? result.mode : s.mode;
  out.num_seqs = static_cast<int32_t>(s.seqs.size());
  out.num_tokens = result.mode != ForwardMode::kIdle
                       ? result.num_tokens
                       : static_cast<int64_t>(batch_.input_ids.size());

  size_t row = 0;  // entry of result.tokens (a logit row when one token per row)
  const double t = outputs_->now();
  for (size_t i = 0; i < s.seqs.size(); ++i) {
    const ScheduledSeq& q = s.seqs[i];
    Req* r = q.req;
    const int32_t n = !q.completes_fill ? 0 : result.counts.empty() ? 1 : result.counts[i];
    if (q.is_decode) {
      scheduler_->complete_decode(r, std::max(n, 1));
    } else {
      scheduler_->complete_extend(q);
    }
    for (int32_t j = 0; j < n; ++j, ++row) {
      r->cache.tokens.push_back(result.tokens[row]);
      if (outputs_->take(*r, result, row, t, out))
        PAGODA_CHECK(j == n - 1, "the worker emitted tokens past request {}'s finish", r->id);
    }
  }
  outputs_->count(out);
  if (config_.check_integrity) memory_->check_integrity();
  return out;
}

bool Engine::abort(RequestId id) {
  Req& r = find_req(reqs_, id);
  // Overlap: the step in flight is resolved first (its tokens go out with the next step).
  if (r.state != RequestState::kFinished && overlap_ != nullptr) overlap_->drain();
  if (r.state == RequestState::kFinished) return false;
  scheduler_->cancel(&r, FinishReason::kAbort);
  r.out.finish_s = outputs_->now();
  ++stats_.aborted_by_user;
  if (config_.check_integrity) memory_->check_integrity();
  return true;
}

void Engine::run_until_idle() {
  while (has_work()) step();
}

RequestOutput Engine::output(RequestId id) const {
  const Req& r = find_req(reqs_, id);
  RequestOutput o = r.out;
  o.state = r.state;
  o.output_ids.assign(r.cache.tokens.begin() + r.prompt_len,
                      r.cache.tokens.end() - r.unresolved);  // placeholders are not ids yet
  return o;
}

void Engine::release(RequestId id) {
  const Req& r = find_req(reqs_, id);
  PAGODA_REQUIRE(r.state == RequestState::kFinished && !r.out.kv_held, kFailedPrecondition,
                 "request {} is not finished or still holds its KV (release_kv)", id);
  reqs_.erase(id);
}

EngineStats Engine::stats() const {
  if (overlap_ != nullptr) overlap_->wait();  // the worker's counters are its thread's
  EngineStats s = stats_;
  s.scheduler = scheduler_->stats();
  const cache::PrefixCache& cache = memory_->cache();
  s.cache = cache.stats();
  const model::WorkerStats w = worker_->stats();
  s.device_path = w.device;
  s.cuda_graphs = w.num_graphs;
  s.kv_bytes = w.kv_bytes;
  s.swa_kv_bytes = w.swa_kv_bytes;
  s.cuda_graph_steps = w.graph_steps;
  s.spec_graph_steps = w.spec_graph_steps;
  if (spec_ != nullptr) {
    const SpecStats& sp = spec_->spec_stats();
    s.spec = sp.accept;
    s.spec_steps = sp.accept.rounds;
    s.draft_forwards = sp.draft_forwards;
    s.draft_graph_steps = sp.draft_graph_steps;
    s.spec_time = sp.time;
  }
  s.num_waiting = static_cast<int64_t>(scheduler_->num_waiting());
  s.num_running = static_cast<int64_t>(scheduler_->num_running());
  s.pages_total = memory_->total_pages();
  s.pages_free = memory_->free_pages();
  s.pages_cached = cache.total_size() / config_.page_size;
  s.swa_pages_total = memory_->swa_total_pages();
  s.swa_pages_free = memory_->swa_free_pages();
  if (memory_->hicache() != nullptr) {
    s.hicache = true;
    s.tier = memory_->hicache()->tier_stats();
  }
  return s;
}

}  // namespace pagoda::engine
