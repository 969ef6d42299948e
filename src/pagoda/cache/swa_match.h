#pragma once
/// The window-aware cut of a prefix match (SGLang's SWA radix match rule; docs/design/cache.md
/// §SWA): a model with sliding-window layers can reuse a cached prefix of m tokens only if the
/// sliding layers' KV of the window before m is still resident, because the first recomputed
/// token (position m) reads keys [m - window_left, m]. Pages whose window KV was released
/// (kv::SwaPages: a request's window slid past them, or the tree evicted a node's window side)
/// can still serve the full layers, but a match must not end just after them.

#include <cstdint>
#include <span>

#include "pagoda/core/ids.h"
#include "pagoda/kv/swa_pages.h"

namespace pagoda::cache {

/// The longest usable part of a match whose full slots are `slots` (positions [0, n), pages
/// held): the largest m in {n} ∪ {multiples of page_size below n} such that every position of
/// [max(0, m - window_left), m) lies in a page that still has its SWA page (m = 0 always
/// qualifies). window_left >= 0 (the largest window of the model's sliding layers; FlashInfer
/// convention). O(n / page_size). Throws Error(kInvalidArgument) for window_left < 0, and
/// SwaPages' errors for a slot outside the pool.
int64_t swa_usable_prefix(std::span<const SlotIndex> slots, const kv::SwaPages& pages,
                          int window_left);

}  // namespace pagoda::cache
