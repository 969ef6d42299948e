// The mutant family: one ReferenceFaults fault each, and the column that must catch it.
#include <fmt/format.h>

#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/core/error.h"

namespace pagoda::backends::conformance {

namespace {

struct Member {
  MutantInfo info;
  ReferenceFaults faults;
};

const std::vector<Member>& members() {
  static const std::vector<Member> all = {
      {{"mutant:causal-shift", "extend", "causal boundary one key early (the diagonal hidden)"},
       {.causal_shift = -1}},
      {{"mutant:drop-sinks", "sinks", "attention sinks ignored"}, {.drop_sinks = true}},
      {{"mutant:window+1", "window", "sliding window one key too wide"}, {.window_shift = 1}},
      {{"mutant:no-softcap", "softcap", "logit soft cap skipped"}, {.skip_softcap = true}},
      {{"mutant:mask-bit", "verify-tree", "one custom-mask bit flipped (last query, last key)"},
       {.flip_mask_bit = true}},
      {{"mutant:page+1", "long", "each request's last page read at page id + 1"},
       {.page_off_by_one = true}},
      {{"mutant:split-lse", "long",
        "keys past 256 merged as a second split-KV chunk with natural-log LSEs"},
       {.bad_split_merge_chunk = 256}},
      {{"mutant:fp8-scale", "fp8-e4m3", "k_scale / v_scale ignored on dequantisation"},
       {.ignore_kv_scale = true}},
      {{"mutant:gqa-map", "decode", "q head h reads kv head h % Hkv (not h / group)"},
       {.interleaved_gqa = true}},
  };
  return all;
}

}  // namespace

const std::vector<MutantInfo>& mutant_family() {
  static const std::vector<MutantInfo> infos = [] {
    std::vector<MutantInfo> v;
    for (const Member& m : members()) v.push_back(m.info);
    return v;
  }();
  return infos;
}

const MutantInfo* find_mutant(const std::string& spec) {
  const std::string name = spec == "mutant" ? "mutant:causal-shift" : spec;
  for (const MutantInfo& m : mutant_family()) {
    if (m.spec == name) return &m;
  }
  return nullptr;
}

ReferenceFaults mutant_faults(const std::string& spec) {
  const std::string name = spec == "mutant" ? "mutant:causal-shift" : spec;
  for (const Member& m : members()) {
    if (m.info.spec == name) return m.faults;
  }
  std::string names;
  for (const Member& m : members()) names += (names.empty() ? "" : ", ") + m.info.spec;
  throw_error(ErrorCode::kInvalidArgument, "--backends: unknown mutant '{}' (known: {}; \"mutant\" runs them all)", spec, names);
}

}  // namespace pagoda::backends::conformance
