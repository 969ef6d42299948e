#pragma once
/// Grammar-constrained decoding (structured output) through llguidance, a library consumed as a
/// dependency: its C API in the `llguidance` PyPI wheel's shared object (_lib.abi3.so), loaded
/// at run time. The object refers to CPython symbols (it is also a Python extension), so a
/// libpython is loaded first with RTLD_GLOBAL; Python is never initialised (the llg_* functions
/// do not call it). Both stay loaded for the life of the process. Contract:
/// docs/design/server.md "Structured output".
///
/// Grammar::load builds llguidance's tokenizer once from pagoda's (every id's bytes, EOS, an
/// encode callback); Grammar::matcher compiles one request's response_format into an
/// engine::TokenConstraint. Thread rules: load and matcher may be called from any thread (a
/// Grammar is immutable after load); each matcher is used by one thread at a time.

#include <memory>
#include <string>
#include <string_view>

#include "pagoda/engine/token_constraint.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::grammar {

/// What a request asks for: any JSON object, JSON matching a JSON schema, or text matching a
/// grammar in llguidance's Lark-like syntax (its docs/syntax.md; lazy lexemes let free text run
/// until a trigger string, e.g. a tool call's marker).
enum class GrammarKind : uint8_t { kJsonObject, kJsonSchema, kLark };

class Grammar {
 public:
  /// llguidance's shared object found when pagoda was configured (the installed `llguidance`
  /// Python package's _lib.abi3.so), or empty when it was not installed then.
  static std::string default_library();
  /// Loads `library` (llguidance's _lib.abi3.so) and builds llguidance's tokenizer for a model
  /// whose logits have `vocab_size` entries (ids past `tok`'s vocabulary are never allowed) and
  /// whose end of sequence is `eos`. Throws Error(kUnsupported) naming what is missing (no
  /// libpython, no library, a missing llg_* symbol) and Error(kInternal) with llguidance's
  /// message when it refuses the tokenizer. `tok` must outlive the Grammar.
  static std::unique_ptr<Grammar> load(const std::string& library,
                                       const tokenizer::Tokenizer& tok, int32_t vocab_size,
                                       int32_t eos);
  ~Grammar();
  Grammar(const Grammar&) = delete;
  Grammar& operator=(const Grammar&) = delete;

  /// A fresh matcher for one request: kJsonObject ignores `schema`; kJsonSchema enforces the
  /// JSON schema `schema` (JSON text); kLark the grammar `schema`. Throws
  /// Error(kInvalidArgument) with llguidance's message for one it cannot compile. The matcher must not outlive this Grammar.
  std::shared_ptr<engine::TokenConstraint> matcher(GrammarKind kind, const std::string& schema) const;
  /// llguidance's version string.
  std::string version() const;

  struct Impl;

 private:
  explicit Grammar(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::grammar
