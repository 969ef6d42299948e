#include "pagoda/attention/forward_mode.h"

namespace pagoda::attention {

std::string_view forward_mode_name(ForwardMode m) {
  switch (m) {
    case ForwardMode::kExtend: return "extend";
    case ForwardMode::kDecode: return "decode";
    case ForwardMode::kMixed: return "mixed";
    case ForwardMode::kTargetVerify: return "target_verify";
    case ForwardMode::kDraftExtend: return "draft_extend";
    case ForwardMode::kIdle: return "idle";
  }
  return "unknown";
}

}  // namespace pagoda::attention
