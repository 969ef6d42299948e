#include "pagoda/grammar/grammar.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/grammar/llg_api.h"

namespace pagoda::grammar {

struct Grammar::Impl {
  llg::NewTokenizerFn new_tokenizer = nullptr;
  llg::FreeTokenizerFn free_tokenizer = nullptr;
  llg::InitDefaultsFn init_defaults = nullptr;
  llg::NewMatcherFn new_matcher = nullptr;
  llg::MatcherErrorFn matcher_error = nullptr;
  llg::MaskByteSizeFn mask_byte_size = nullptr;
  llg::ComputeMaskIntoFn compute_mask_into = nullptr;
  llg::ConsumeTokenFn consume_token = nullptr;
  llg::IsStoppedFn is_stopped = nullptr;
  llg::FreeMatcherFn free_matcher = nullptr;
  llg::VersionFn version = nullptr;
  const tokenizer::Tokenizer* tok = nullptr;
  llg::Tokenizer* llg_tok = nullptr;
  int32_t eos = -1;
};

namespace {

/// libpython for the object's CPython references: the one found at configure time, then any
/// abi3-compatible CPython (>= 3.9).
void load_libpython() {
  std::vector<std::string> names;
  if (std::string(PAGODA_LIBPYTHON).size() > 0) names.emplace_back(PAGODA_LIBPYTHON);
  for (int minor = 14; minor >= 9; --minor)
    names.push_back("libpython3." + std::to_string(minor) + ".so.1.0");
  for (const std::string& n : names)
    if (dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return;
  throw_error(ErrorCode::kUnsupported,
              "llguidance needs a libpython3 (>= 3.9) to load and none was found (tried {} and "
              "libpython3.9-14.so.1.0; Debian: apt-get install libpython3-dev)",
              names.front());
}

template <typename Fn>
void resolve(void* lib, const char* name, Fn& fn, const std::string& library) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  PAGODA_REQUIRE(fn != nullptr, kUnsupported, "llguidance library {} has no symbol {}", library,
                 name);
}

/// llguidance's tokenize callback: pagoda's encoder, without special tokens. It must not throw
/// across the C boundary: a tokenizer error gives no tokens (llguidance then falls back on its
/// own byte tokenization of that text).
size_t tokenize_cb(const void* user, const uint8_t* bytes, size_t len, uint32_t* out,
                   size_t out_len) {
  const auto* tok = static_cast<const tokenizer::Tokenizer*>(user);
  try {
    const std::vector<int32_t> ids =
        tok->encode(std::string_view(reinterpret_cast<const char*>(bytes), len), false);
    for (size_t i = 0; i < ids.size() && i < out_len; ++i) out[i] = static_cast<uint32_t>(ids[i]);
    return ids.size();
  } catch (...) {
    return 0;
  }
}

/// One request's llguidance matcher as the engine's TokenConstraint.
class LlgConstraint final : public engine::TokenConstraint {
 public:
  LlgConstraint(const Grammar::Impl& g, llg::Matcher* m) : g_(g), m_(m) {}
  ~LlgConstraint() override { g_.free_matcher(m_); }
  LlgConstraint(const LlgConstraint&) = delete;
  LlgConstraint& operator=(const LlgConstraint&) = delete;

  void allowed(std::span<uint32_t> mask) override {
    const size_t bytes = g_.mask_byte_size(m_);
    if (error_.empty() && bytes <= mask.size_bytes() &&
        g_.compute_mask_into(m_, mask.data(), bytes) == 0)
      return;
    if (error_.empty())
      error_ = bytes > mask.size_bytes() ? "mask larger than the vocabulary" : last_error();
    std::fill(mask.begin(), mask.end(), 0u);
    mask[static_cast<size_t>(g_.eos) / 32] = 1u << (g_.eos % 32);
  }
  void consume(int32_t token) override {
    if (error_.empty() && g_.consume_token(m_, static_cast<uint32_t>(token)) != 0)
      error_ = last_error();
  }
  bool done() const override { return g_.is_stopped(m_); }
  std::string error() const override { return error_; }

 private:
  std::string last_error() const {
    const char* e = g_.matcher_error(m_);
    return e != nullptr ? e : "llguidance failed without a message";
  }
  const Grammar::Impl& g_;
  llg::Matcher* m_;
  std::string error_;
};

}  // namespace

std::string Grammar::default_library() { return PAGODA_LLGUIDANCE_LIBRARY; }

Grammar::Grammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Grammar::~Grammar() { impl_->free_tokenizer(impl_->llg_tok); }

std::unique_ptr<Grammar> Grammar::load(const std::string& library,
                                       const tokenizer::Tokenizer& tok, int32_t vocab_size,
                                       int32_t eos) {
  PAGODA_REQUIRE(!library.empty(), kUnsupported,
                 "llguidance was not found when pagoda was configured (pip install llguidance; "
                 "or give serve --grammar-library PATH to its _lib.abi3.so)");
  PAGODA_REQUIRE(eos >= 0 && eos < vocab_size, kInvalidArgument,
                 "structured output needs an EOS token in [0, {}) (got {})", vocab_size, eos);
  load_libpython();
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw_error(ErrorCode::kUnsupported, "cannot load llguidance library {}: {}", library,
                why != nullptr ? why : "unknown error");
  }
  auto impl = std::make_unique<Impl>();
  resolve(lib, "llg_new_tokenizer", impl->new_tokenizer, library);
  resolve(lib, "llg_free_tokenizer", impl->free_tokenizer, library);
  resolve(lib, "llg_constraint_init_set_defaults", impl->init_defaults, library);
  resolve(lib, "llg_new_matcher", impl->new_matcher, library);
  resolve(lib, "llg_matcher_get_error", impl->matcher_error, library);
  resolve(lib, "llg_matcher_get_mask_byte_size", impl->mask_byte_size, library);
  resolve(lib, "llg_matcher_compute_mask_into", impl->compute_mask_into, library);
  resolve(lib, "llg_matcher_consume_token", impl->consume_token, library);
  resolve(lib, "llg_matcher_is_stopped", impl->is_stopped, library);
  resolve(lib, "llg_free_matcher", impl->free_matcher, library);
  resolve(lib, "llg_get_version", impl->version, library);
  impl->tok = &tok;
  impl->eos = eos;

  // Every id's bytes: special tokens as llguidance marks them (0xFF, then the name), ids past
  // the tokenizer's vocabulary (padding) as empty tokens, which it never allows. A token is
  // decoded after a plain one ("a") and that one's text removed, so decoders that drop a
  // leading space at the start of a text (SentencePiece, Metaspace) keep it.
  std::vector<uint32_t> lens(static_cast<size_t>(vocab_size), 0);
  std::string bytes;
  std::vector<int32_t> pair = tok.encode("a", false);
  const std::string lead = tok.decode(pair, false);
  pair.push_back(0);
  for (int32_t id = 0; id < vocab_size && id < tok.vocab_size(); ++id) {
    const std::array<int32_t, 1> one{id};
    std::string text;
    if (tok.is_special(id) || id == eos || pair.size() == 1) {
      text = tok.decode(one, false);
    } else {
      pair.back() = id;
      text = tok.decode(pair, false);
      text = text.starts_with(lead) ? text.substr(lead.size()) : tok.decode(one, false);
    }
    if (tok.is_special(id) || id == eos) {
      if (text.empty()) text = "<[" + std::to_string(id) + "]>";
      text.insert(text.begin(), '\xFF');
    }
    lens[static_cast<size_t>(id)] = static_cast<uint32_t>(text.size());
    bytes += text;
  }
  llg::TokenizerInit init{};
  init.vocab_size = static_cast<uint32_t>(vocab_size);
  init.tok_eos = static_cast<uint32_t>(eos);
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  init.tokenize_assumes_string = tok.kind() != "byte";  // the others need valid UTF-8
  init.tokenize_fn = &tokenize_cb;
  init.tokenize_user_data = &tok;
  std::array<char, 1024> err{};
  impl->llg_tok = impl->new_tokenizer(&init, err.data(), err.size());
  PAGODA_REQUIRE(impl->llg_tok != nullptr, kInternal, "llguidance refused the tokenizer: {}",
                 err.data());
  return std::unique_ptr<Grammar>(new Grammar(std::move(impl)));
}

std::shared_ptr<engine::TokenConstraint> Grammar::matcher(GrammarKind kind,
                                                          const std::string& schema) const {
  llg::ConstraintInit init{};
  impl_->init_defaults(&init, impl_->llg_tok);
  init.log_stderr_level = 0;  // errors come back through llg_matcher_get_error
  const bool object = kind == GrammarKind::kJsonObject;
  const char* type = object ? "json_object" : kind == GrammarKind::kLark ? "lark" : "json_schema";
  llg::Matcher* m = impl_->new_matcher(&init, type, object ? "{}" : schema.c_str());
  const char* e = impl_->matcher_error(m);
  if (e != nullptr) {
    std::string message = e;
    impl_->free_matcher(m);
    throw Error(ErrorCode::kInvalidArgument, message);
  }
  return std::make_shared<LlgConstraint>(*impl_, m);
}

std::string Grammar::version() const { return impl_->version(); }

}  // namespace pagoda::grammar
