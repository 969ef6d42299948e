#pragma once
/// The part of llguidance's C API (its parser/llguidance.h, version pinned in scripts/setup.sh)
/// that grammar.cpp calls, declared here as the interface it is: the structs pagoda fills and the
/// function types it resolves with dlsym. Internal to the grammar module.

#include <cstddef>
#include <cstdint>

namespace pagoda::grammar::llg {

struct Tokenizer;  // LlgTokenizer (opaque)
struct Matcher;    // LlgMatcher (opaque)

struct ParserLimits {  // LlgParserLimits
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

struct ConstraintInit {  // LlgConstraintInit
  const Tokenizer* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  ParserLimits limits;
};

using TokenizeFn = size_t (*)(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                              uint32_t* output_tokens, size_t output_tokens_len);

struct TokenizerInit {  // LlgTokenizerInit (v1: one EOS)
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;
  const uint8_t* token_bytes;
  const char* tokenizer_json;
  bool tokenize_assumes_string;
  TokenizeFn tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;
};

using NewTokenizerFn = Tokenizer* (*)(const TokenizerInit*, char* error, size_t error_len);
using FreeTokenizerFn = void (*)(Tokenizer*);
using InitDefaultsFn = void (*)(ConstraintInit*, const Tokenizer*);
using NewMatcherFn = Matcher* (*)(const ConstraintInit*, const char* type, const char* data);
using MatcherErrorFn = const char* (*)(Matcher*);
using MaskByteSizeFn = size_t (*)(const Matcher*);
using ComputeMaskIntoFn = int32_t (*)(Matcher*, uint32_t* mask, size_t mask_byte_len);
using ConsumeTokenFn = int32_t (*)(Matcher*, uint32_t token);
using IsStoppedFn = bool (*)(const Matcher*);
using FreeMatcherFn = void (*)(Matcher*);
using VersionFn = const char* (*)();

}  // namespace pagoda::grammar::llg
