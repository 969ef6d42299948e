// tokenize_tool: batch driver for check_against_hf.py. Usage:
//   tokenize_tool MODEL_DIR_OR_FILE REQUEST.json RESPONSE.json
// REQUEST: {"texts": [...], "decode_ids": [[...], ...]}. RESPONSE: {"with_special": [[ids]],
// "without_special": [[ids]], "decoded": [text], "decoded_skip": [text], "streamed": [text]}
// (streamed: the incremental detokenizer's pieces joined, skip_special_tokens=false).
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/incremental_detokenizer.h"
#include "pagoda/tokenizer/load.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenize_tool MODEL REQUEST.json RESPONSE.json\n");
    return 2;
  }
  using nlohmann::json;
  try {
    const auto tok = pagoda::tokenizer::load_tokenizer(argv[1]);
    std::ifstream in(argv[2]);
    const json req = json::parse(in);
    json resp = {{"with_special", json::array()}, {"without_special", json::array()},
                 {"decoded", json::array()},      {"decoded_skip", json::array()},
                 {"streamed", json::array()},     {"vocab_size", tok->vocab_size()},
                 {"bos_id", tok->bos_id()},       {"eos_id", tok->eos_id()}};
    for (const auto& t : req.at("texts")) {
      const std::string text = t.get<std::string>();
      resp["with_special"].push_back(tok->encode(text, true));
      resp["without_special"].push_back(tok->encode(text, false));
    }
    for (const auto& ids_json : req.at("decode_ids")) {
      const auto ids = ids_json.get<std::vector<int32_t>>();
      resp["decoded"].push_back(tok->decode(ids, false));
      resp["decoded_skip"].push_back(tok->decode(ids, true));
      pagoda::tokenizer::IncrementalDetokenizer detok(*tok, false);
      std::string streamed;
      for (int32_t id : ids) streamed += detok.push(id);
      streamed += detok.finish();
      resp["streamed"].push_back(streamed);
    }
    std::ofstream out(argv[3]);
    out << resp.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const pagoda::Error& e) {
    std::fprintf(stderr, "tokenize_tool: %s\n", e.what());
    return 1;
  }
  return 0;
}
