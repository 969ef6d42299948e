// `pagoda tokenize`: text -> ids (or ids -> text with --decode) with a model's tokenizer.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"
#include "pagoda/tokenizer/load.h"

namespace pagoda::cli {

namespace {

struct TokenizeOptions {
  std::string model = "builtin";
  std::string text;
  std::string ids;
  bool decode = false;
  bool json = false;
  bool no_special = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(item, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    PAGODA_REQUIRE(used == item.size() && v >= 0 && v <= INT32_MAX, kInvalidArgument,
                   "bad token id '{}'", item);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& o) {
  const std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer::make_tokenizer_for(o.model);
  if (o.decode) {
    PAGODA_REQUIRE(o.text.empty(), kInvalidArgument, "--decode takes --ids, not --text");
    const std::string text = tok->decode(parse_ids(o.ids), o.no_special);
    if (o.json) {
      const nlohmann::json j = {{"text", text}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::printf("\n");
    }
    return;
  }
  PAGODA_REQUIRE(o.ids.empty(), kInvalidArgument, "--ids needs --decode");
  const std::vector<int32_t> ids = tok->encode(o.text, !o.no_special);
  if (o.json) {
    std::printf("%s\n", nlohmann::json({{"ids", ids}}).dump().c_str());
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
  std::printf("\n");
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids (or decode ids to text)");
  cmd->add_option("--model", opts->model,
                  "builtin (byte tokenizer), or a model folder with tokenizer.json / "
                  "tokenizer.model (or one of those files)")
      ->capture_default_str();
  cmd->add_option("--text", opts->text, "text to encode");
  cmd->add_option("--ids", opts->ids, "token ids to decode, comma separated (with --decode)");
  cmd->add_flag("--decode", opts->decode, "decode --ids instead of encoding --text");
  cmd->add_flag("--json", opts->json, "print {\"ids\": [...]} (or {\"text\": ...} with --decode)");
  cmd->add_flag("--no-special", opts->no_special,
                "encode without BOS/template tokens; decode without special tokens");
  cmd->callback([opts] { run_tokenize(*opts); });
}

}  // namespace pagoda::cli
