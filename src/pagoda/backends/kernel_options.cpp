#include "pagoda/backends/kernel_options.h"

#include <charconv>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/core/error.h"

namespace pagoda::backends {

namespace {

/// Calls f(name, field) for every option, in the order kernel_option_values prints them.
template <typename Options, typename F>
void for_each_option(Options& o, F&& f) {
  f("mla_decode", o.mla_decode);
  f("decode_min_chunk", o.decode_min_chunk);
  f("mla_sm90", o.cuda.mla_sm90);
  f("mla_sm90_small", o.cuda.mla_sm90_small);
  f("mla_tma", o.cuda.mla_tma);
  f("sm90_prefill", o.sm90_prefill);
  f("sm90_tma", o.cuda.sm90_tma);
  f("sm90_tma_store", o.cuda.sm90_tma_store);
  f("sm90_persistent", o.cuda.sm90_persistent);
  f("sm90_max_blocks", o.cuda.sm90_max_blocks);
  f("sm90_head_major", o.cuda.sm90_head_major);
  f("sm90_pingpong", o.cuda.sm90_pingpong);
  f("sm90_overlap", o.cuda.sm90_overlap);
  f("sm90_fp8", o.cuda.sm90_fp8);
  f("sm90_mla_k64", o.cuda.sm90_mla_k64);
  f("sm90_unit_lists", o.cuda.sm90_unit_lists);
  f("merge_threads", o.cuda.merge_threads);
  f("cpu_bf16", o.cpu_bf16);
  f("cpu_bf16_decode", o.cpu_bf16_decode);
  f("amx_tiles", o.amx_tiles);
}

bool parse_value(std::string_view text, bool& out) {
  if (text == "1" || text == "true" || text == "on") return out = true, true;
  if (text == "0" || text == "false" || text == "off") return out = false, true;
  return false;
}

bool parse_value(std::string_view text, int& out) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  out = v;
  return true;
}

std::string print_value(bool v) { return v ? "true" : "false"; }
std::string print_value(int v) { return std::to_string(v); }

}  // namespace

void KernelOptions::validate() const {
  PAGODA_REQUIRE(decode_min_chunk >= 16 && decode_min_chunk % 16 == 0, kInvalidArgument,
                 "kernel option decode_min_chunk must be a multiple of 16 and >= 16, got {}",
                 decode_min_chunk);
  PAGODA_REQUIRE(cuda.sm90_max_blocks >= 0, kInvalidArgument,
                 "kernel option sm90_max_blocks must be >= 0 (0 = no cap), got {}",
                 cuda.sm90_max_blocks);
  PAGODA_REQUIRE(cuda.sm90_pingpong >= -1 && cuda.sm90_pingpong <= 1, kInvalidArgument,
                 "kernel option sm90_pingpong must be -1 (auto), 0 or 1, got {}",
                 cuda.sm90_pingpong);
  const int t = cuda.merge_threads;
  PAGODA_REQUIRE(t == 0 || (t >= 32 && t <= 512 && t % 32 == 0), kInvalidArgument,
                 "kernel option merge_threads must be 0 (sized) or 32..512 in steps of 32, got {}",
                 t);
}

void set_kernel_option(KernelOptions& options, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  PAGODA_REQUIRE(eq != std::string_view::npos, kInvalidArgument,
                 "kernel option '{}' is not NAME=VALUE", assignment);
  const std::string_view name = assignment.substr(0, eq);
  const std::string_view value = assignment.substr(eq + 1);
  KernelOptions next = options;
  bool found = false;
  std::vector<std::string_view> names;
  for_each_option(next, [&](std::string_view n, auto& field) {
    names.push_back(n);
    if (n != name) return;
    found = true;
    PAGODA_REQUIRE(parse_value(value, field), kInvalidArgument,
                   "kernel option {}: '{}' is not a valid {}", name, value,
                   std::is_same_v<std::decay_t<decltype(field)>, bool>
                       ? "boolean (1/0, true/false, on/off)"
                       : "integer");
  });
  PAGODA_REQUIRE(found, kInvalidArgument, "unknown kernel option '{}' (known: {})", name,
                 fmt::join(names, ", "));
  next.validate();
  options = next;
}

std::vector<std::pair<std::string, std::string>> kernel_option_values(
    const KernelOptions& options) {
  std::vector<std::pair<std::string, std::string>> out;
  for_each_option(options, [&](std::string_view n, const auto& field) {
    out.emplace_back(std::string(n), print_value(field));
  });
  return out;
}

}  // namespace pagoda::backends
