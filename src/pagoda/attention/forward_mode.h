#pragma once
/// ForwardMode: what one engine step computes (ARCHITECTURE §3, sglang_spec §2.1). The mode is
/// data set by the scheduler; backends never infer it from lengths (a fully cached prompt is a
/// one-token extend, not a decode).

#include <cstdint>
#include <string_view>

namespace pagoda::attention {

enum class ForwardMode : uint8_t {
  kExtend,        ///< prefill, or extend after a cached prefix (chunked prefill = several)
  kDecode,        ///< one new token per request (also each step of a multi-step draft)
  kMixed,         ///< extend requests plus decode requests (extend_len 1) in one batch
  kTargetVerify,  ///< speculative verify: num_draft_tokens per request under a tree mask
  kDraftExtend,   ///< draft model extends over the accepted tokens (variable count per request)
  kIdle,          ///< no sequences; forward returns an empty output
};

constexpr bool is_decode_or_idle(ForwardMode m) {
  return m == ForwardMode::kDecode || m == ForwardMode::kIdle;
}

/// "extend", "decode", "mixed", "target_verify", "draft_extend", "idle".
std::string_view forward_mode_name(ForwardMode m);

}  // namespace pagoda::attention
