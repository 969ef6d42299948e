#include "pagoda/python/engine_bindings.h"

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/tokenizer/load.h"
#ifdef PAGODA_PYTHON_HAVE_SERVER
#include "pagoda/server/server.h"
#endif

namespace nb = nanobind;

namespace pagoda::python {
namespace {

std::optional<DType> dtype_option(const std::string& name, const char* what) {
  if (name.empty() || name == "auto") return std::nullopt;
  const std::optional<DType> t = parse_dtype(name);
  PAGODA_REQUIRE(t.has_value(), kInvalidArgument, "{}: unknown dtype '{}'", what, name);
  return t;
}

/// Engine settings pagoda.LLM passes (names as in EngineConfig; see python/pagoda/llm.py).
struct EngineArgs {
  std::string backend;
  int page_size = 16;
  int64_t pool_tokens = 32768;
  int max_running_requests = 64;
  int chunk_size = 0;
  int max_prefill_tokens = 8192;
  bool radix_cache = true;
  bool cuda_graph = true;
  std::string dtype;
  std::string kv_dtype;
  int max_context_len = 0;
};

/// One request's sampling: (max_new_tokens, temperature, top_k, top_p, min_p, seed, ignore_eos).
using Sampling = std::tuple<int, float, int, float, float, uint64_t, bool>;
/// One finished request: (output ids, finish reason name, cached prompt tokens, error).
using Result = std::tuple<std::vector<int32_t>, std::string, int64_t, std::string>;

/// The model, its tokenizer, a platform and one Engine over them (members in dependency order).
class PyEngine {
 public:
  PyEngine(const std::string& model, uint64_t weight_seed, const EngineArgs& a)
      : loaded_(model::load_model(model, weight_seed)), llama_(loaded_.config, loaded_.weights) {
    if (model == "builtin" || tokenizer::has_tokenizer(model))
      tokenizer_ = tokenizer::make_tokenizer_for(model);
    backends::BackendSelection selection;
    selection.attention = a.backend;
    platform_ = engine::make_platform_for(selection);
    engine::EngineConfig cfg;
    cfg.page_size = a.page_size;
    cfg.pool_tokens = a.pool_tokens;
    cfg.max_context_len = a.max_context_len;
    cfg.radix_cache = a.radix_cache;
    cfg.cuda_graph = a.cuda_graph;
    cfg.dtype = dtype_option(a.dtype, "dtype");
    cfg.kv_dtype = dtype_option(a.kv_dtype, "kv_cache_dtype");
    cfg.scheduler.max_running_requests = a.max_running_requests;
    cfg.scheduler.chunk_size = a.chunk_size;
    cfg.scheduler.max_prefill_tokens = a.max_prefill_tokens;
    cfg.backend.attention = a.backend.empty() ? engine::default_backend_name(*platform_) : a.backend;
    cfg.validate();
    engine_ = std::make_unique<engine::Engine>(llama_, cfg, platform_.get());
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    return tokenizer().encode(text, add_special_tokens);
  }
  /// Bytes: a cut through a multi-byte character (or a random model's output) is not UTF-8.
  nb::bytes decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    const std::string text = tokenizer().decode(ids, skip_special_tokens);
    return nb::bytes(text.data(), text.size());
  }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }

  /// Queues every prompt (all checked before the first is queued), runs the engine until
  /// idle, returns the results in prompt order and releases the requests.
  std::vector<Result> generate(const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<Sampling>& sampling) {
    PAGODA_REQUIRE(prompts.size() == sampling.size(), kInvalidArgument,
                   "generate: {} prompts but {} sampling parameter sets", prompts.size(),
                   sampling.size());
    std::vector<engine::GenerateRequest> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& [max_new, temperature, top_k, top_p, min_p, seed, ignore_eos] = sampling[i];
      engine::GenerateRequest r{.prompt = prompts[i],
                                .max_new_tokens = max_new,
                                .sampling = {.temperature = temperature, .top_k = top_k,
                                             .top_p = top_p, .seed = seed, .min_p = min_p},
                                .ignore_eos = ignore_eos,
                                .extra_key = {}};
      r.sampling.validate();
      PAGODA_REQUIRE(!r.prompt.empty(), kInvalidArgument, "generate: prompt {} is empty", i);
      PAGODA_REQUIRE(max_new >= 1, kInvalidArgument,
                     "generate: max_tokens must be >= 1 (prompt {} has {})", i, max_new);
      for (int32_t id : r.prompt)
        PAGODA_REQUIRE(id >= 0 && id < loaded_.config.vocab_size, kInvalidArgument,
                       "generate: prompt {} has token id {} outside the vocabulary [0, {})", i,
                       id, loaded_.config.vocab_size);
      requests.push_back(std::move(r));
    }
    std::vector<engine::RequestId> ids;
    std::vector<Result> results;
    {
      nb::gil_scoped_release release;
      try {
        for (auto& r : requests) ids.push_back(engine_->add_request(std::move(r)));
        engine_->run_until_idle();
      } catch (...) {
        for (engine::RequestId id : ids) engine_->abort(id);
        engine_->run_until_idle();
        for (engine::RequestId id : ids) engine_->release(id);
        throw;
      }
      for (engine::RequestId id : ids) {
        engine::RequestOutput out = engine_->output(id);
        results.emplace_back(std::move(out.output_ids), engine::finish_reason_name(out.finish_reason),
                             out.cached_tokens, std::move(out.error));
        engine_->release(id);
      }
    }
    return results;
  }

  std::string backend_name() const { return engine_->worker().backend_name(); }
  std::string model_name() const { return loaded_.config.name; }
  int vocab_size() const { return loaded_.config.vocab_size; }
  int64_t leaked_pages() const { return engine_->memory().leaked_pages(); }
  std::tuple<int64_t, int64_t, int64_t, int64_t> cache_stats() const {
    const engine::EngineStats s = engine_->stats();
    return {s.cache.queried_tokens, s.cache.matched_tokens, s.generated_tokens, s.steps};
  }

 private:
  const tokenizer::Tokenizer& tokenizer() const {
    PAGODA_REQUIRE(tokenizer_ != nullptr, kUnsupported,
                   "this checkpoint has no tokenizer.json / tokenizer.model: pass token ids");
    return *tokenizer_;
  }

  model::LoadedModel loaded_;
  model::LlamaModel llama_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<platform::Platform> platform_;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<EngineArgs>(m, "EngineArgs", "Engine settings (see pagoda.LLM for their names).")
      .def(nb::init<>())
      .def_rw("backend", &EngineArgs::backend)
      .def_rw("page_size", &EngineArgs::page_size)
      .def_rw("pool_tokens", &EngineArgs::pool_tokens)
      .def_rw("max_running_requests", &EngineArgs::max_running_requests)
      .def_rw("chunk_size", &EngineArgs::chunk_size)
      .def_rw("max_prefill_tokens", &EngineArgs::max_prefill_tokens)
      .def_rw("radix_cache", &EngineArgs::radix_cache)
      .def_rw("cuda_graph", &EngineArgs::cuda_graph)
      .def_rw("dtype", &EngineArgs::dtype)
      .def_rw("kv_dtype", &EngineArgs::kv_dtype)
      .def_rw("max_context_len", &EngineArgs::max_context_len);
  nb::class_<PyEngine>(m, "Engine",
      "The continuous-batching engine over one model ('builtin' or a Hugging Face checkpoint "
      "folder). Not thread-safe; generate() releases the GIL while it runs.")
      .def(nb::init<const std::string&, uint64_t, const EngineArgs&>(), nb::arg("model"),
           nb::arg("weight_seed"), nb::arg("args"))
      .def("encode", &PyEngine::encode, nb::arg("text"), nb::arg("add_special_tokens") = true)
      .def("decode", &PyEngine::decode, nb::arg("ids"), nb::arg("skip_special_tokens") = true,
           "The text of ids as UTF-8 bytes (may be cut inside a character).")
      .def_prop_ro("has_tokenizer", &PyEngine::has_tokenizer)
      .def("generate", &PyEngine::generate, nb::arg("prompts"), nb::arg("sampling"),
           "prompts: lists of token ids; sampling: one (max_new_tokens, temperature, top_k, "
           "top_p, min_p, seed, ignore_eos) per prompt. Returns one (output_ids, finish_reason, "
           "cached_tokens, error) per prompt, in order.")
      .def_prop_ro("backend_name", &PyEngine::backend_name)
      .def_prop_ro("model_name", &PyEngine::model_name)
      .def_prop_ro("vocab_size", &PyEngine::vocab_size)
      .def("leaked_pages", &PyEngine::leaked_pages)
      .def("stats", &PyEngine::cache_stats,
           "(prefix-cache queried tokens, matched tokens, generated tokens, steps)");
#ifdef PAGODA_PYTHON_HAVE_SERVER
  nb::class_<server::ServeOptions>(m, "ServeOptions", "`pagoda serve` options (server.h).")
      .def(nb::init<>())
      .def_rw("model", &server::ServeOptions::model)
      .def_rw("weight_seed", &server::ServeOptions::weight_seed)
      .def_rw("served_model_name", &server::ServeOptions::served_model_name)
      .def_rw("host", &server::ServeOptions::host)
      .def_rw("port", &server::ServeOptions::port)
      .def_rw("api_key", &server::ServeOptions::api_key)
      .def_rw("max_queue", &server::ServeOptions::max_queue)
      .def_rw("max_running", &server::ServeOptions::max_running)
      .def_rw("backend", &server::ServeOptions::backend)
      .def_rw("page_size", &server::ServeOptions::page_size)
      .def_rw("pool_tokens", &server::ServeOptions::pool_tokens)
      .def_rw("chunk_size", &server::ServeOptions::chunk_size)
      .def_rw("lpm", &server::ServeOptions::lpm)
      .def_rw("cuda_graph", &server::ServeOptions::cuda_graph)
      .def_rw("chat_template", &server::ServeOptions::chat_template)
      .def_rw("drain_timeout_s", &server::ServeOptions::drain_timeout_s);
  m.def(
      "serve",
      [](const server::ServeOptions& o, const std::string& dtype, const std::string& kv_dtype) {
        server::ServeOptions s = o;
        s.dtype = dtype_option(dtype, "dtype");
        s.kv_dtype = dtype_option(kv_dtype, "kv_cache_dtype");
        nb::gil_scoped_release release;
        return server::run_server(s);
      },
      nb::arg("options"), nb::arg("dtype") = "", nb::arg("kv_dtype") = "",
      "Runs `pagoda serve` in this process until SIGTERM / SIGINT; returns its exit status.");
#endif
}

}  // namespace pagoda::python
