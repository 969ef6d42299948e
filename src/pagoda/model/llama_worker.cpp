#include "pagoda/model/llama_worker.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/model/logit_processing.h"

namespace pagoda::model {

using attention::ForwardBatch;
using attention::ForwardMode;

int64_t WorkerBatch::num_logit_rows() const {
  int64_t n = 0;
  for (int32_t r : logit_rows) n += r;
  return n;
}

std::vector<std::byte> ModelWorker::stage(const WorkerBatch& /*batch*/) { return {}; }

WorkerOutput ModelWorker::run_staged(const WorkerBatch& batch,
                                     std::span<const std::byte> /*staged*/) {
  return run(batch);
}

void ModelWorker::move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) {
  kv_pool().move_kv(src, dst);
}

/// Pinned host memory for the per-step copies (grow-only).
struct LlamaWorker::Staging {
  platform::Allocator* pinned = nullptr;
  platform::DeviceBuffer ints, params, out_ids;
  size_t ints_cap = 0, params_cap = 0, out_cap = 0;

  void reserve(size_t n_ints, size_t n_params, size_t n_out) {
    auto grow = [&](platform::DeviceBuffer& b, size_t& cap, size_t need, size_t elem) {
      if (need <= cap) return;
      cap = std::max(need, cap * 2);
      b = platform::make_buffer(*pinned, cap * elem);
    };
    grow(ints, ints_cap, n_ints, sizeof(int32_t));
    grow(params, params_cap, n_params, sizeof(SampleRow));
    grow(out_ids, out_cap, n_out, sizeof(int32_t));
  }
};

attention::BackendRequirements worker_backend_requirements(const LlamaModel& model,
                                                           const WorkerConfig& config,
                                                           DType q_dtype,
                                                           const std::string& device) {
  attention::BackendRequirements req = model.backend_requirements(config.page_size);
  req.q_dtype = q_dtype;
  req.kv_dtype = config.kv_dtype;
  req.mixed_batches = config.mixed_batches;
  req.device = device;
  return req;
}

LlamaWorker::LlamaWorker(const LlamaModel& model, std::unique_ptr<ModelOps> ops,
                         const WorkerConfig& config, kv::ReqToTokenTable& table)
    : model_(&model), ops_(std::move(ops)), config_(config), platform_(&ops_->platform()) {
  PAGODA_REQUIRE(config.page_size >= 1 && config.num_pages >= 1, kInvalidArgument,
                 "worker needs page_size >= 1 and num_pages >= 1 (got {} / {})",
                 config.page_size, config.num_pages);
  PAGODA_REQUIRE(config.max_batch_size >= 1, kInvalidArgument,
                 "max_batch_size must be >= 1 (got {})", config.max_batch_size);
  if (config.swa != nullptr) {
    PAGODA_REQUIRE(config.comm == nullptr, kUnsupported,
                   "the SWA pool does not run with tensor parallelism yet (turn it off)");
    PAGODA_REQUIRE(model.config().has_sliding_window(), kInvalidArgument,
                   "an SWA pool for a model without sliding-window layers");
    PAGODA_REQUIRE(config.swa->page_size() == config.page_size, kInvalidArgument,
                   "SWA pool page size {} differs from the worker's {}",
                   config.swa->page_size(), config.page_size);
  }
  // With the SWA pool each pool stores only its kind of layers (LlamaModel::pool_layer).
  const bool split = config.swa != nullptr;
  using Kind = LlamaModel::PoolLayers;
  kv::KvPoolConfig pc =
      model.kv_pool_config(config.num_pages, config.page_size, split ? Kind::kFull : Kind::kAll);
  pc.dtype = config.kv_dtype;
  if (config.comm != nullptr)  // this rank's KV heads only
    pc.num_kv_heads = Decoder::shard_of(model.config(), config.comm->rank(),
                                        config.comm->world_size())
                          .num_kv_heads;
  pool_ = std::make_unique<kv::KvPool>(pc, platform_->allocator());
  backends::register_builtin_backends(registry_, config.backend.kernels);
  const attention::BackendRequirements req =
      worker_backend_requirements(model, config, ops_->dtype(), platform_->name());
  const attention::BackendContext ctx{
      .platform = platform_, .kv_pool = pool_.get(), .req_to_token = &table};
  backend_ = backends::make_backend(registry_, config.backend, req, ctx);
  PAGODA_REQUIRE(backend_->capabilities().device == platform_->name(), kUnsupported,
                 "backend '{}' runs on '{}' but the model runs on '{}'", backend_->name(),
                 backend_->capabilities().device, platform_->name());
  decoder_ = std::make_unique<Decoder>(model, *ops_, pool_.get(), config.comm, split);
  decoder_->set_mla_prefill(config.mla_prefill, config.mla_window_keys);
  if (model.config().has_linear_layers()) {
    state_pool_ = std::make_unique<kv::StatePool>(
        model.config().num_linear_layers(),
        config.state_slots > 0 ? config.state_slots : config.max_batch_size,
        mamba2_shape(model.config()).state_shape(), *platform_);
    // The Mamba2 layers' backend: --linear-backend, else the attention selection's. The mixer
    // hands it f32 views whatever the ops' dtype.
    linear_backend_ = backends::make_linear_backend(
        registry_, config.backend,
        {.dtype = DType::kF32, .tree_verify = false, .cuda_graph = false,
         .device = platform_->name()},
        {.platform = platform_});
  }
  stats_.kv_bytes = pool_->total_bytes();
  if (split) {
    for (int l = 0; l < model.config().num_layers; ++l)
      swa_window_ = std::max(swa_window_, model.config().window_of(l));
    kv::KvPoolConfig spc =
        model.kv_pool_config(config.swa->swa().num_pages(), config.page_size, Kind::kWindow);
    spc.dtype = config.kv_dtype;
    swa_pool_ = std::make_unique<kv::KvPool>(spc, platform_->allocator());
    stats_.swa_kv_bytes = swa_pool_->total_bytes();
    swa_table_ = std::make_unique<kv::SwaTable>(table, *config.swa, swa_window_);
    const attention::BackendContext swa_ctx{
        .platform = platform_, .kv_pool = swa_pool_.get(), .req_to_token = &swa_table_->table()};
    swa_backend_ = backends::make_backend(registry_, config.backend, req, swa_ctx);
  }
  staging_ = std::make_unique<Staging>();
  staging_->pinned = &platform_->pinned_allocator();
  stats_.device = platform_->kind() != platform::PlatformKind::kCpu;
  if (config.cuda_graph && config.swa == nullptr && state_pool_ == nullptr &&
      ops_->supports_graphs() && backend_->capabilities().cuda_graph) {
    graph_backend_ = backends::make_backend(registry_, config.backend, req, ctx);
    capture_graphs();
    // Verify steps of a DSA model stay eager (the backends capture DSA decode steps only).
    if (config.verify_graph_tokens > 0 && !model.config().is_dsa()) {
      const int cap = config.verify_graph_tokens;
      verify_backend_ = backends::make_backend(registry_, config.backend, req, ctx);
      verify_backend_->init_cuda_graph_state(cap, cap);
      decoder_->reserve(verify_acts_, cap, cap);
    }
  }
}

LlamaWorker::~LlamaWorker() {
  try {
    platform_->synchronize_stream();
  } catch (...) {  // a destructor must not throw; the device error was reported before
  }
  graphs_.clear();
}

void LlamaWorker::validate(const WorkerBatch& b) const {
  const ForwardBatch& f = b.forward;
  const int64_t t = f.num_tokens();
  const int bs = f.batch_size;
  const int64_t vocab = model_->config().vocab_size;
  PAGODA_REQUIRE(f.mode == ForwardMode::kExtend || f.mode == ForwardMode::kDecode ||
                     f.mode == ForwardMode::kMixed || f.mode == ForwardMode::kTargetVerify ||
                     f.mode == ForwardMode::kDraftExtend || f.mode == ForwardMode::kIdle,
                 kInvalidArgument, "unknown forward mode");
  PAGODA_REQUIRE(static_cast<int64_t>(b.input_ids.size()) == t, kInvalidArgument,
                 "{} input ids for a batch of {} tokens", b.input_ids.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(f.positions.size()) == t, kInvalidArgument,
                 "{} positions for a batch of {} tokens", f.positions.size(), t);
  PAGODA_REQUIRE(static_cast<int>(b.logit_rows.size()) == bs &&
                     static_cast<int>(b.sampling.size()) == bs &&
                     static_cast<int>(b.sample_step.size()) == bs,
                 kInvalidArgument,
                 "logit_rows / sampling / sample_step have {} / {} / {} entries for {} sequences",
                 b.logit_rows.size(), b.sampling.size(), b.sample_step.size(), bs);
  for (int32_t id : b.input_ids)
    PAGODA_REQUIRE(id >= 0 && id < vocab, kOutOfRange, "token id {} outside [0, {})", id, vocab);
  PAGODA_REQUIRE(b.top_k >= 0 && b.top_k <= kMaxTopK && b.top_k <= vocab, kInvalidArgument,
                 "top_k {} outside [0, min({}, vocab {})]", b.top_k, kMaxTopK, vocab);
  const int64_t logit_rows = std::accumulate(b.logit_rows.begin(), b.logit_rows.end(), int64_t{0});
  for (size_t i = 0; i < b.logit_adjust.size(); ++i) {
    const LogitAdjust& a = b.logit_adjust[i];
    PAGODA_REQUIRE(a.row >= 0 && a.row < logit_rows && a.token >= 0 && a.token < vocab,
                   kInvalidArgument, "logit_adjust {} (row {}, token {}) outside {} rows x {}",
                   i, a.row, a.token, logit_rows, vocab);
    PAGODA_REQUIRE(i == 0 || std::pair(b.logit_adjust[i - 1].row, b.logit_adjust[i - 1].token) <
                                 std::pair(a.row, a.token),
                   kInvalidArgument, "logit_adjust is not strictly ordered by (row, token) at {}",
                   i);
  }
  const int64_t words = token_mask_words(vocab);
  PAGODA_REQUIRE(b.token_mask.size() == b.mask_rows.size() * static_cast<size_t>(words),
                 kInvalidArgument, "token_mask has {} words for {} mask rows of {} words",
                 b.token_mask.size(), b.mask_rows.size(), words);
  for (size_t i = 0; i < b.mask_rows.size(); ++i) {
    const int32_t row = b.mask_rows[i];
    PAGODA_REQUIRE(row >= 0 && row < logit_rows && (i == 0 || b.mask_rows[i - 1] < row),
                   kInvalidArgument,
                   "mask_rows[{}] = {} is outside [0, {}) or not above the one before", i, row,
                   logit_rows);
    PAGODA_REQUIRE(mask_allows_some(std::span<const uint32_t>(b.token_mask)
                                        .subspan(i * static_cast<size_t>(words),
                                                 static_cast<size_t>(words)),
                                    vocab),
                   kInvalidArgument, "the token mask of logit row {} allows no token", row);
  }
  PAGODA_REQUIRE(state_pool_ == nullptr ? b.state_slots.empty()
                                        : static_cast<int>(b.state_slots.size()) == bs,
                 kInvalidArgument, "{} state slots for {} sequences of a model {} Mamba2 layers",
                 b.state_slots.size(), bs, state_pool_ == nullptr ? "without" : "with");
  PAGODA_REQUIRE(state_pool_ == nullptr || (f.mode != ForwardMode::kDraftExtend &&
                                            !f.is_draft_step()),
                 kUnsupported,
                 "draft steps are not supported on a model with Mamba2 layers (the hybrid state "
                 "pool runs as a verify target only)");
  PAGODA_REQUIRE(state_pool_ == nullptr || f.mode != ForwardMode::kTargetVerify ||
                     !b.state_node_slots.empty(),
                 kUnsupported,
                 "a verify step on a model with Mamba2 layers needs a state slot per draft node "
                 "(WorkerBatch::state_node_slots: the rollback of rejected draft tokens)");
  PAGODA_REQUIRE((b.state_node_slots.empty() && b.state_node_parents.empty()) ||
                     (state_pool_ != nullptr && f.mode == ForwardMode::kTargetVerify &&
                      b.state_node_slots.size() == b.state_node_parents.size()),
                 kInvalidArgument,
                 "state node slots ({}) and parents ({}) are for a verify step of a model with "
                 "Mamba2 layers, one each per draft node",
                 b.state_node_slots.size(), b.state_node_parents.size());
  const bool extend = f.mode != ForwardMode::kDecode && f.mode != ForwardMode::kIdle;
  PAGODA_REQUIRE(!extend || static_cast<int>(f.extend_seq_lens.size()) == bs, kInvalidArgument,
                 "extend batch has {} extend lengths for {} sequences", f.extend_seq_lens.size(),
                 bs);
  int64_t total = 0;
  for (int i = 0; i < bs; ++i) {
    const int64_t n = extend ? f.extend_seq_lens[i] : (f.mode == ForwardMode::kDecode ? 1 : 0);
    PAGODA_REQUIRE(b.logit_rows[i] >= 0 && b.logit_rows[i] <= n, kInvalidArgument,
                   "sequence {} asks for {} logit rows of its {} query tokens", i,
                   b.logit_rows[i], n);
    b.sampling[i].validate();
    total += n;
  }
  PAGODA_REQUIRE(f.mode != ForwardMode::kDecode || t == bs || f.is_draft_step(), kInvalidArgument,
                 "a decode batch of {} sequences has {} tokens", bs, t);
  PAGODA_REQUIRE(!extend || total == t, kInvalidArgument,
                 "extend lengths sum to {} but the batch has {} tokens", total, t);
}

void LlamaWorker::stage(Activations& a, std::span<const int32_t> ids,
                        std::span<const int32_t> positions, std::span<const int32_t> cache_loc,
                        std::span<const int32_t> rows, std::span<const SampleRow> params,
                        std::span<const int32_t> mask_rows, std::span<const uint32_t> mask) {
  // Layout of a.ints (decoder.h): ids | positions | slots [a.tokens each] | logit rows [a.rows]
  // | mask count [1] | mask rows [a.rows] | out [a.rows]; staged up to the last mask row.
  PAGODA_CHECK(static_cast<int64_t>(mask_rows.size()) <= a.rows);
  const size_t n_ints = static_cast<size_t>(3 * a.tokens + a.rows + 1) + mask_rows.size();
  staging_->reserve(n_ints, static_cast<size_t>(a.rows), static_cast<size_t>(a.rows));
  int32_t* h = static_cast<int32_t*>(staging_->ints.get());
  std::fill(h, h + n_ints, 0);
  std::copy(ids.begin(), ids.end(), h);
  std::copy(positions.begin(), positions.end(), h + a.tokens);
  std::copy(cache_loc.begin(), cache_loc.end(), h + 2 * a.tokens);
  std::copy(rows.begin(), rows.end(), h + 3 * a.tokens);
  h[3 * a.tokens + a.rows] = static_cast<int32_t>(mask_rows.size());
  std::copy(mask_rows.begin(), mask_rows.end(), h + 3 * a.tokens + a.rows + 1);
  platform_->copy_to_device_async(a.ids(), h, n_ints * sizeof(int32_t));
  if (!mask.empty())  // the words as build_batch wrote them (one async copy, no repacking)
    platform_->copy_to_device_async(a.mask_words(), mask.data(), mask.size_bytes());
  if (!params.empty()) {
    SampleRow* hp = static_cast<SampleRow*>(staging_->params.get());
    std::copy(params.begin(), params.end(), hp);
    platform_->copy_to_device_async(a.params(), hp, params.size() * sizeof(SampleRow));
  }
}

void LlamaWorker::adjust_logits(Activations& a, const WorkerBatch& b) {
  if (b.logit_adjust.empty()) return;
  const size_t bytes = b.logit_adjust.size() * sizeof(LogitAdjust);
  if (adjust_dev_bytes_ < bytes) {
    platform_->synchronize_stream();  // an earlier step may still read the old buffer
    adjust_dev_bytes_ = std::max(bytes, 2 * adjust_dev_bytes_);
    adjust_dev_ = platform::make_buffer(platform_->allocator(), adjust_dev_bytes_);
  }
  platform_->copy_to_device_async(adjust_dev_.get(), b.logit_adjust.data(), bytes);
  ops_->adjust_logits(a.logits_f32(), model_->config().vocab_size,
                      static_cast<const LogitAdjust*>(adjust_dev_.get()),
                      static_cast<int64_t>(b.logit_adjust.size()));
}

WorkerOutput LlamaWorker::finish(Activations& a, int64_t rows, const WorkerBatch& b) {
  WorkerOutput out;
  out.tokens.resize(static_cast<size_t>(rows));
  int32_t* host_ids = static_cast<int32_t*>(staging_->out_ids.get());
  if (rows > 0) platform_->copy_to_host_async(host_ids, a.out_ids(), rows * sizeof(int32_t));
  bool want_logits = b.return_logits;
  const size_t nk = static_cast<size_t>(rows) * static_cast<size_t>(b.top_k);
  if (nk > 0) {
    const size_t bytes = nk * (sizeof(int32_t) + sizeof(float));
    if (topk_dev_bytes_ < bytes) {
      topk_dev_ = platform::make_buffer(platform_->allocator(), bytes);
      topk_dev_bytes_ = bytes;
    }
    auto* ids = static_cast<int32_t*>(topk_dev_.get());
    auto* lps = reinterpret_cast<float*>(ids + nk);
    if (ops_->top_k_logprobs(a.logits_f32(), rows, model_->config().vocab_size, b.top_k, ids,
                             lps)) {
      out.top_ids.resize(nk);
      out.top_logprobs.resize(nk);
      platform_->copy_to_host_async(out.top_ids.data(), ids, nk * sizeof(int32_t));
      platform_->copy_to_host_async(out.top_logprobs.data(), lps, nk * sizeof(float));
    } else {
      want_logits = true;  // the caller takes the top-k of the whole rows
    }
  }
  if (want_logits && rows > 0) {
    out.logits.resize(static_cast<size_t>(rows * model_->config().vocab_size));
    platform_->copy_to_host_async(out.logits.data(), a.logits_f32(),
                                  out.logits.size() * sizeof(float));
  }
  platform_->synchronize_stream();
  std::copy(host_ids, host_ids + rows, out.tokens.begin());
  ++stats_.steps;
  return out;
}

WorkerOutput LlamaWorker::run(const WorkerBatch& b) {
  validate(b);
  const ForwardBatch& f = b.forward;
  const int64_t t = f.num_tokens();
  if (f.mode == ForwardMode::kIdle || t == 0) return {};
  // Logit rows: the last logit_rows[i] query tokens of each sequence.
  rows_.clear();
  params_.clear();
  const bool decode = f.mode == ForwardMode::kDecode;
  int64_t start = 0;
  for (int i = 0; i < f.batch_size; ++i) {
    const int64_t n = decode ? 1 : f.extend_seq_lens[i];
    const SamplingParams& s = b.sampling[i];
    for (int32_t r = 0; r < b.logit_rows[i]; ++r) {
      rows_.push_back(static_cast<int32_t>(start + n - b.logit_rows[i] + r));
      params_.push_back(SampleRow{.temperature = s.temperature,
                                  .top_k = s.top_k,
                                  .top_p = s.top_p,
                                  .min_p = s.min_p,
                                  .seed = s.seed,
                                  .step = b.sample_step[i] + r});
    }
    start += n;
  }
  const int64_t nrows = static_cast<int64_t>(rows_.size());

  if (!b.hidden_layers.empty()) return run_with_hidden(b, t, nrows);
  // logit_adjust runs eagerly (the graphs sample unadjusted); token masks replay (their count,
  // rows and words are staged into the graph's fixed buffers).
  const bool adjust = !b.logit_adjust.empty();
  if (verify_backend_ != nullptr && f.mode == ForwardMode::kTargetVerify && !adjust) {
    WorkerOutput out;
    if (run_verify_graph(b, nrows, out)) return out;
  }
  const bool all_rows = decode && nrows == t;
  if (!graphs_.empty() && all_rows && !adjust && !f.is_draft_step() && t <= buckets_.back()) {
    const size_t gi = static_cast<size_t>(
        std::lower_bound(buckets_.begin(), buckets_.end(), static_cast<int>(t)) -
        buckets_.begin());
    const int bs = buckets_[gi];
    ForwardBatch padded = f;
    pad_decode_batch(padded, bs, graph_backend_->cuda_graph_seq_len_fill_value());
    ids_.assign(b.input_ids.begin(), b.input_ids.end());
    ids_.resize(static_cast<size_t>(bs), 0);
    rows_.resize(static_cast<size_t>(bs));
    std::iota(rows_.begin(), rows_.end(), 0);
    params_.resize(static_cast<size_t>(bs), SampleRow{});
    graph_backend_->init_forward_metadata_replay_cuda_graph(padded);
    stage(graph_acts_, ids_, padded.positions, padded.out_cache_loc, rows_, params_, b.mask_rows,
          b.token_mask);
    graphs_[gi]->replay();
    ++stats_.graph_steps;
    stats_.padded_rows += bs - t;
    return finish(graph_acts_, nrows, b);
  }
  decoder_->reserve(eager_, t, std::max<int64_t>(nrows, 1),
                    decoder_->expanded_mla_keys(f, *backend_));
  stage(eager_, b.input_ids, f.positions, f.out_cache_loc, rows_, params_, b.mask_rows,
        b.token_mask);
  if (pool_->num_layers() > 0) backend_->init_forward_metadata(f);  // else every layer has a window
  WindowSide window;
  if (swa_backend_ != nullptr) {
    window = WindowSide{.backend = swa_backend_.get(), .batch = &window_batch(f)};
    swa_backend_->init_forward_metadata(*window.batch);
  }
  decoder_->forward(eager_, f, *backend_, t, nrows, nullptr,
                    swa_backend_ != nullptr ? &window : nullptr, state_side(b));
  adjust_logits(eager_, b);
  decoder_->sample(eager_, nrows, !b.mask_rows.empty());
  return finish(eager_, nrows, b);
}

const StateSide* LlamaWorker::state_side(const WorkerBatch& b) {
  if (state_pool_ == nullptr) return nullptr;
  const ForwardBatch& f = b.forward;
  state_seqs_.clear();
  const bool tree = !b.state_node_slots.empty();
  size_t node0 = 0;
  for (int i = 0; i < f.batch_size; ++i) {
    const int32_t n =
        f.mode == ForwardMode::kDecode ? 1 : f.extend_seq_lens[static_cast<size_t>(i)];
    Mamba2Seq q{.slot = b.state_slots[static_cast<size_t>(i)], .num_tokens = n};
    if (tree) {
      PAGODA_REQUIRE(node0 + static_cast<size_t>(n) <= b.state_node_slots.size(), kInvalidArgument,
                     "{} state node slots for a verify step of more tokens",
                     b.state_node_slots.size());
      q.node_slots = std::span(b.state_node_slots).subspan(node0, static_cast<size_t>(n));
      q.node_parents = std::span(b.state_node_parents).subspan(node0, static_cast<size_t>(n));
      node0 += static_cast<size_t>(n);
    }
    state_seqs_.push_back(q);
  }
  PAGODA_REQUIRE(!tree || node0 == b.state_node_slots.size(), kInvalidArgument,
                 "{} state node slots for a verify step of {} tokens", b.state_node_slots.size(),
                 node0);
  state_side_ =
      StateSide{.pool = state_pool_.get(), .seqs = state_seqs_, .backend = linear_backend_.get()};
  return &state_side_;
}

const ForwardBatch& LlamaWorker::window_batch(const ForwardBatch& f) {
  const kv::SwaPages& swa = *config_.swa;
  swa_batch_ = f;
  for (int32_t& s : swa_batch_.out_cache_loc) {
    s = swa.swa_slot(s);
    PAGODA_CHECK(s >= 0, "a new token's page has no SWA page");
  }
  // The plan reads each row from its window's first page on (O(window), not O(kv_len)); a
  // verify step's tree mask spans every key, so it keeps the whole row (page 0 below the window).
  const bool start = f.mode != ForwardMode::kTargetVerify;
  swa_batch_.kv_start.assign(start ? static_cast<size_t>(f.batch_size) : 0, 0);
  for (int b = 0; b < f.batch_size; ++b) {
    const ReqSlot r{f.req_pool_indices[static_cast<size_t>(b)]};
    if (r.value() == 0) continue;  // padding
    const int64_t kv_len = f.seq_lens[static_cast<size_t>(b)] +
                           (f.mode == ForwardMode::kTargetVerify ? f.spec.num_draft_tokens : 0);
    const int64_t first_q = f.mode == ForwardMode::kDecode
                                ? kv_len - 1
                                : int64_t{f.extend_prefix_lens[static_cast<size_t>(b)]};
    swa_table_->update(r, first_q, kv_len);  // every key a window layer reads, from its page
    if (start)
      swa_batch_.kv_start[static_cast<size_t>(b)] =
          static_cast<int32_t>(swa_table_->window_begin(first_q));
  }
  return swa_batch_;
}

WorkerOutput LlamaWorker::run_with_hidden(const WorkerBatch& b, int64_t t, int64_t nrows) {
  const ModelConfig& c = model_->config();
  for (int32_t l : b.hidden_layers)
    PAGODA_REQUIRE(l >= 0 && l < c.num_layers, kInvalidArgument,
                   "hidden_layers asks for layer {} of a {}-layer model", l, c.num_layers);
  const int64_t width = static_cast<int64_t>(b.hidden_layers.size()) * c.hidden_size;
  const size_t bytes = static_cast<size_t>(t * width) * sizeof(float);
  if (bytes > hidden_cap_) {
    platform_->synchronize_stream();
    hidden_cap_ = std::max(bytes, 2 * hidden_cap_);
    hidden_buf_ = platform::make_buffer(platform_->allocator(), hidden_cap_);
  }
  const HiddenCapture cap{.layers = b.hidden_layers,
                          .dst = static_cast<float*>(hidden_buf_.get())};
  const ForwardBatch& f = b.forward;
  decoder_->reserve(eager_, t, std::max<int64_t>(nrows, 1),
                    decoder_->expanded_mla_keys(f, *backend_));
  stage(eager_, b.input_ids, f.positions, f.out_cache_loc, rows_, params_, b.mask_rows,
        b.token_mask);
  backend_->init_forward_metadata(f);
  PAGODA_REQUIRE(swa_backend_ == nullptr, kUnsupported,
                 "hidden-state capture (EAGLE) does not run on the SWA pool");
  decoder_->forward(eager_, f, *backend_, t, nrows, &cap, nullptr, state_side(b));
  adjust_logits(eager_, b);
  decoder_->sample(eager_, nrows, !b.mask_rows.empty());
  std::vector<float> hidden(static_cast<size_t>(t * width));
  platform_->copy_to_host_async(hidden.data(), hidden_buf_.get(), bytes);
  WorkerOutput out = finish(eager_, nrows, b);  // synchronizes
  out.hidden = std::move(hidden);
  return out;
}

void LlamaWorker::move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) {
  kv::KvPool& pool = *pool_;
  PAGODA_REQUIRE(src.size() == dst.size(), kInvalidArgument,
                 "move_kv got {} sources and {} destinations", src.size(), dst.size());
  const int64_t slots = pool.num_slots();
  for (size_t i = 0; i < src.size(); ++i)
    PAGODA_REQUIRE(src[i] >= 0 && src[i] < slots && dst[i] >= 0 && dst[i] < slots, kOutOfRange,
                   "move_kv pair {} ({} -> {}) outside [0, {})", i, src[i], dst[i], slots);
  if (src.empty() || pool.num_layers() == 0) return;
  // One row per slot in each buffer: K rows and V rows (MHA) have the same size.
  const int layers = pool.config().num_layers;
  const bool mla = pool.config().layout == kv::KvLayout::kMla;
  // Slot s of a buffer is the row at s × token stride (the pool's [page, offset] layout).
  auto row_bytes = [](const TensorView& t) {
    return t.stride(0) == t.size(1) * t.stride(1) && t.stride(1) == t.size(2) * t.size(3)
               ? static_cast<size_t>(t.stride(1)) * dtype_size(t.dtype())
               : size_t{0};
  };
  const size_t row = row_bytes(pool.k_view(LayerId{0}));
  bool same = row > 0;
  std::vector<void*> bases;
  for (int l = 0; l < layers; ++l) {
    const TensorView k = pool.k_view(LayerId{l});
    same = same && row_bytes(k) == row;
    bases.push_back(k.data());
    if (mla) continue;
    const TensorView v = pool.v_view(LayerId{l});
    same = same && row_bytes(v) == row;
    bases.push_back(v.data());
  }
  if (!same || !ops_->move_rows(bases, row, src, dst)) pool.move_kv(src, dst);
}

bool LlamaWorker::run_verify_graph(const WorkerBatch& b, int64_t nrows, WorkerOutput& out) {
  const ForwardBatch& f = b.forward;
  const int n = f.spec.num_draft_tokens;
  const int nreq = f.batch_size;
  if (n < 1 || nreq < 1) return false;
  const int r = b.logit_rows[0];
  for (int i = 0; i < nreq; ++i)
    if (f.extend_seq_lens[static_cast<size_t>(i)] != n || b.logit_rows[static_cast<size_t>(i)] != r)
      return false;
  const int max_bs = config_.verify_graph_tokens / n;
  if (max_bs < nreq) return false;
  const std::vector<int> buckets = cuda_graph_batch_sizes(max_bs);
  const int bs = *std::lower_bound(buckets.begin(), buckets.end(), nreq);
  const std::array<int, 3> key = {n, r, bs};
  auto it = verify_graphs_.find(key);
  if (it == verify_graphs_.end() && verify_graphs_.size() >= kMaxVerifyGraphs) return false;
  ForwardBatch padded = f;
  pad_verify_batch(padded, bs);
  const int64_t t = int64_t{bs} * n, rows = int64_t{bs} * r;
  ids_.assign(b.input_ids.begin(), b.input_ids.end());
  ids_.resize(static_cast<size_t>(t), 0);
  rows_.resize(static_cast<size_t>(rows), 0);  // padded requests' rows: row 0 (never returned)
  params_.resize(static_cast<size_t>(rows), SampleRow{});
  if (it == verify_graphs_.end()) {
    // Capture on this batch: every run below writes the same K/V the replay writes.
    stage(verify_acts_, ids_, padded.positions, padded.out_cache_loc, rows_, params_, {}, {});
    it = verify_graphs_
             .emplace(key, capture_step(verify_acts_, padded, *verify_backend_, t, rows,
                                        verify_shape_known_))
             .first;
    stats_.num_spec_graphs = static_cast<int>(verify_graphs_.size());
  }
  verify_backend_->init_forward_metadata_replay_cuda_graph(padded);
  stage(verify_acts_, ids_, padded.positions, padded.out_cache_loc, rows_, params_, b.mask_rows,
        b.token_mask);
  it->second->replay();
  ++stats_.spec_graph_steps;
  stats_.padded_rows += (bs - nreq) * int64_t{n};
  out = finish(verify_acts_, nrows, b);
  return true;
}

std::unique_ptr<ModelOps::Graph> LlamaWorker::capture_step(Activations& a, const ForwardBatch& f,
                                                           attention::AttentionBackend& backend,
                                                           int64_t t, int64_t rows,
                                                           bool& shape_known) {
  auto body = [&] {
    decoder_->forward(a, f, backend, t, rows);
    decoder_->sample(a, rows, /*masked=*/true);  // a no-op while the staged count is 0
  };
  if (!shape_known) {  // the backend learns the layer shape from one eager forward
    backend.init_forward_metadata(f);
    body();
    shape_known = true;
  }
  backend.init_forward_metadata_capture_cuda_graph(f);
  for (int warm = 0; warm < 2; ++warm) body();
  platform_->synchronize_stream();
  return ops_->capture(body);
}

void LlamaWorker::capture_graphs() {
  const int max_bs = config_.max_batch_size;
  buckets_ = cuda_graph_batch_sizes(max_bs);
  const int fill = graph_backend_->cuda_graph_seq_len_fill_value();
  graph_backend_->init_cuda_graph_state(max_bs, max_bs);
  decoder_->reserve(graph_acts_, max_bs, max_bs);
  std::vector<std::unique_ptr<ModelOps::Graph>> graphs(buckets_.size());
  bool shape_known = false;
  for (size_t i = buckets_.size(); i-- > 0;) {  // largest first, like SGLang
    const int bs = buckets_[i];
    ForwardBatch dummy;
    dummy.mode = ForwardMode::kDecode;
    pad_decode_batch(dummy, bs, fill);  // row 0, slot 0, seq_len = fill
    std::vector<int32_t> ids(static_cast<size_t>(bs), 0), rows(static_cast<size_t>(bs));
    std::iota(rows.begin(), rows.end(), 0);
    const std::vector<SampleRow> params(static_cast<size_t>(bs), SampleRow{});
    stage(graph_acts_, ids, dummy.positions, dummy.out_cache_loc, rows, params, {}, {});
    graphs[i] = capture_step(graph_acts_, dummy, *graph_backend_, bs, bs, shape_known);
  }
  platform_->synchronize_stream();
  graphs_ = std::move(graphs);
  stats_.num_graphs = static_cast<int>(graphs_.size());
}

std::vector<int> cuda_graph_batch_sizes(int max_bs) {
  PAGODA_REQUIRE(max_bs >= 1, kInvalidArgument, "max_bs must be >= 1 (got {})", max_bs);
  std::vector<int> all = {1, 2, 4, 8, 12};
  for (int b = 16; b <= 256; b += 8) all.push_back(b);
  for (int b = 272; b < 512; b += 16) all.push_back(b);
  for (int b = 512; b <= max_bs; b += 32) all.push_back(b);
  std::vector<int> out;
  for (int b : all)
    if (b <= max_bs) out.push_back(b);
  if (out.empty() || out.back() != max_bs) out.push_back(max_bs);
  return out;
}

void pad_decode_batch(ForwardBatch& batch, int bucket_bs, int fill_seq_len) {
  PAGODA_REQUIRE(batch.mode == ForwardMode::kDecode, kInvalidArgument,
                 "only decode batches are padded (got {})",
                 attention::forward_mode_name(batch.mode));
  PAGODA_REQUIRE(bucket_bs >= batch.batch_size && fill_seq_len >= 1, kInvalidArgument,
                 "bucket {} below batch size {} or fill {} < 1", bucket_bs, batch.batch_size,
                 fill_seq_len);
  const int pad = bucket_bs - batch.batch_size;
  batch.req_pool_indices.insert(batch.req_pool_indices.end(), pad, 0);
  batch.seq_lens.insert(batch.seq_lens.end(), pad, fill_seq_len);
  batch.positions.insert(batch.positions.end(), pad, fill_seq_len - 1);
  batch.out_cache_loc.insert(batch.out_cache_loc.end(), pad, 0);
  batch.batch_size = bucket_bs;
}

void pad_verify_batch(ForwardBatch& batch, int bucket_bs) {
  PAGODA_REQUIRE(batch.mode == ForwardMode::kTargetVerify, kInvalidArgument,
                 "pad_verify_batch needs a target-verify batch (got {})",
                 attention::forward_mode_name(batch.mode));
  const int n = batch.spec.num_draft_tokens, bs = batch.batch_size;
  PAGODA_REQUIRE(bs >= 1 && n >= 1 && bucket_bs >= bs, kInvalidArgument,
                 "verify batch of {} requests × {} tokens cannot be padded to {}", bs, n,
                 bucket_bs);
  PAGODA_REQUIRE(static_cast<int>(batch.extend_seq_lens.size()) == bs &&
                     static_cast<int>(batch.seq_lens.size()) == bs &&
                     static_cast<int>(batch.extend_prefix_lens.size()) == bs &&
                     static_cast<int>(batch.req_pool_indices.size()) == bs &&
                     static_cast<int64_t>(batch.positions.size()) == int64_t{bs} * n &&
                     static_cast<int64_t>(batch.out_cache_loc.size()) == int64_t{bs} * n,
                 kInvalidArgument,
                 "verify batch arrays do not match {} requests × {} tokens (positions {}, "
                 "out_cache_loc {})",
                 bs, n, batch.positions.size(), batch.out_cache_loc.size());
  for (int i = 0; i < bs; ++i)
    PAGODA_REQUIRE(batch.extend_seq_lens[static_cast<size_t>(i)] == n, kInvalidArgument,
                   "verify request {} has {} query tokens, not num_draft_tokens {}", i,
                   batch.extend_seq_lens[static_cast<size_t>(i)], n);
  const size_t mask0 = static_cast<size_t>(n) * static_cast<size_t>(batch.seq_lens[0] + n);
  PAGODA_REQUIRE(batch.spec.tree_mask.size() >= mask0, kInvalidArgument,
                 "spec.tree_mask has {} bytes, request 0 needs {}", batch.spec.tree_mask.size(),
                 mask0);
  const int pad = bucket_bs - bs;
  if (pad == 0) return;
  const std::vector<uint8_t> block(batch.spec.tree_mask.begin(),
                                   batch.spec.tree_mask.begin() + static_cast<ptrdiff_t>(mask0));
  const std::vector<int32_t> pos(batch.positions.begin(), batch.positions.begin() + n);
  for (int p = 0; p < pad; ++p) {
    batch.req_pool_indices.push_back(batch.req_pool_indices[0]);
    batch.seq_lens.push_back(batch.seq_lens[0]);
    batch.extend_prefix_lens.push_back(batch.extend_prefix_lens[0]);
    batch.extend_seq_lens.push_back(n);
    batch.positions.insert(batch.positions.end(), pos.begin(), pos.end());
    batch.out_cache_loc.insert(batch.out_cache_loc.end(), static_cast<size_t>(n), 0);
    batch.spec.tree_mask.insert(batch.spec.tree_mask.end(), block.begin(), block.end());
  }
  batch.batch_size = bucket_bs;
}

}  // namespace pagoda::model
