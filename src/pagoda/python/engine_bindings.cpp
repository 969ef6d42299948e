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
#include "pagoda/engine/engine_args.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/ops.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/python/attention_bindings.h"
#include "pagoda/tokenizer/load.h"
#ifdef PAGODA_PYTHON_HAVE_SERVER
#include "pagoda/server/server.h"
#endif

namespace nb = nanobind;

namespace pagoda::python {
namespace {

/// One request's sampling: (max_new_tokens, temperature, top_k, top_p, min_p, seed, ignore_eos).
using Sampling = std::tuple<int, float, int, float, float, uint64_t, bool>;
/// One finished request: (output ids, finish reason name, cached prompt tokens, error).
using Result = std::tuple<std::vector<int32_t>, std::string, int64_t, std::string>;

/// The model, its tokenizer, a platform and one Engine over them (members in dependency order).
class PyEngine {
 public:
  /// The settings are checked (engine::make_engine_config) before the model loads.
  PyEngine(const std::string& model, uint64_t weight_seed, const engine::EngineArgs& a)
      : platform_(engine::make_platform(a)),
        config_(engine::make_engine_config(a, *platform_)),
        loaded_(model::load_model(model, weight_seed,
                                  engine::load_options(a, *platform_, /*tensor_parallel=*/false))),
        llama_(loaded_.config, std::move(loaded_.weights)) {
    // As the CLI's prepare_host_threads: OpenBLAS single-threaded, the attention backend owns
    // the OpenMP threads (both spinning on 2 cores made LLM.generate 8x slower than `pagoda
    // bench` on the CPU). python/pagoda/__init__.py sets OMP_WAIT_POLICY=passive where unset.
    model::set_blas_num_threads(1);
    if (model == "builtin" || tokenizer::has_tokenizer(model))
      tokenizer_ = tokenizer::make_tokenizer_for(model);
    engine_ = std::make_unique<engine::Engine>(llama_, config_, platform_.get());
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

  std::unique_ptr<platform::Platform> platform_;
  engine::EngineConfig config_;
  model::LoadedModel loaded_;
  model::LlamaModel llama_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace

void bind_engine(nb::module_& m) {
  using engine::EngineArgs;
  nb::class_<EngineArgs>(m, "EngineArgs",
                         "Engine settings (engine_args.h; `pagoda serve`'s flags with "
                         "underscores; see pagoda.LLM for its keyword names).")
      .def(nb::init<>())
      .def_prop_rw(
          "backend", [](const EngineArgs& a) { return a.backend.attention; },
          [](EngineArgs& a, const std::string& v) { a.backend.attention = v; })
      .def_prop_rw(
          "linear_backend", [](const EngineArgs& a) { return a.backend.linear; },
          [](EngineArgs& a, const std::string& v) { a.backend.linear = v; })
      .def_prop_rw(
          "kernel_options",
          [](const EngineArgs& a) {
            nb::dict d;  // {name: value string}, every option (kernel_option_values)
            for (const auto& [name, value] : backends::kernel_option_values(a.backend.kernels))
              d[name.c_str()] = value;
            return d;
          },
          [](EngineArgs& a, const nb::dict& v) { a.backend.kernels = kernel_options_of(v); })
      .def_rw("page_size", &EngineArgs::page_size)
      .def_rw("pool_tokens", &EngineArgs::pool_tokens)
      .def_rw("kv_cache_memory", &EngineArgs::kv_cache_memory)
      .def_rw("mem_fraction_static", &EngineArgs::mem_fraction_static)
      .def_rw("swa_full_tokens_ratio", &EngineArgs::swa_full_tokens_ratio)
      .def_rw("max_mamba_cache_size", &EngineArgs::max_mamba_cache_size)
      .def_rw("max_running", &EngineArgs::max_running)
      .def_rw("chunk_size", &EngineArgs::chunk_size)
      .def_rw("max_prefill_tokens", &EngineArgs::max_prefill_tokens)
      .def_rw("policy", &EngineArgs::policy)
      .def_rw("radix_cache", &EngineArgs::radix_cache)
      .def_rw("mixed_batches", &EngineArgs::mixed_batches)
      .def_rw("cuda_graph", &EngineArgs::cuda_graph)
      .def_rw("mla_prefill", &EngineArgs::mla_prefill)
      .def_rw("mla_window_keys", &EngineArgs::mla_window_keys)
      .def_rw("overlap", &EngineArgs::overlap)
      .def_rw("dtype", &EngineArgs::dtype)
      .def_rw("kv_dtype", &EngineArgs::kv_dtype)
      .def_rw("cpu_gemm", &EngineArgs::cpu_gemm)
      .def_rw("max_context_len", &EngineArgs::max_context_len);
  nb::class_<PyEngine>(m, "Engine",
      "The continuous-batching engine over one model ('builtin' or a Hugging Face checkpoint "
      "folder). Not thread-safe; generate() releases the GIL while it runs.")
      .def(nb::init<const std::string&, uint64_t, const engine::EngineArgs&>(), nb::arg("model"),
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
      .def_rw("engine", &server::ServeOptions::engine)
      .def_rw("chat_template", &server::ServeOptions::chat_template)
      .def_rw("drain_timeout_s", &server::ServeOptions::drain_timeout_s);
  m.def(
      "serve",
      [](const server::ServeOptions& o) {
        nb::gil_scoped_release release;
        return server::run_server(o);
      },
      nb::arg("options"),
      "Runs `pagoda serve` in this process until SIGTERM / SIGINT; returns its exit status.");
#endif
}

}  // namespace pagoda::python
