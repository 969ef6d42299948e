#pragma once
/// Which keys a query row of a prefill tile sees, as the CUDA kernels decide it. Header-only, no
/// CUDA dependency: compiled by the host compiler it is plain inline C++ (the host tests check
/// hide_row_keys against MaskInfo::visible on random masks, under AddressSanitizer in CI),
/// compiled by nvcc every function is __host__ __device__.
///
/// MaskInfo::visible is the definition (kernel_anchors C0): query token qi of a request (query
/// tokens sit at kv positions kv_len - qo_len + qi) sees key kj when its custom-mask bit
/// qi * kv_len + kj is set (LSB first within a byte) or, without a custom mask, when the mask is
/// not causal or kj is at or before its position; and, with a window w >= 0, when kj is at or
/// after window_start(qi) = its position - w, where under a custom mask the row sits at position
/// qpos[qi] = (keys it sees) - 1 (a tree node's prefix + depth, attention/batch_attention.h).
/// hide_row_keys is the tile form mask_tile<true> (prefill_common.cuh) runs: one interval of keys
/// per row, plus the custom mask's bits read a byte pair at a time.

#include <algorithm>
#include <cstdint>

#include "pagoda/kernels/cuda/fast_div.h"

#if defined(__CUDACC__)
#define PAGODA_MASK_HD __host__ __device__ __forceinline__
#define PAGODA_MASK_UNROLL _Pragma("unroll")
#else
#define PAGODA_MASK_HD inline
#define PAGODA_MASK_UNROLL
#endif

namespace pagoda::kernels::cuda::detail {

/// What decides whether query row qi of a request sees key kj (kernel_anchors C0).
struct MaskInfo {
  int qo_len = 0;
  int kv_len = 0;
  const uint8_t* bits = nullptr;  ///< the request's packed custom mask, or nullptr
  bool causal = true;
  int window = -1;
  /// Custom-mask requests: the request's rows' mask positions (DevicePlan::mask_qpos from its
  /// first query row), kept when a tile clears `bits` for its mask-free keys. nullptr: none.
  const int32_t* qpos = nullptr;

  /// The first key of row qi's window (window >= 0): its position - window. Under a custom mask
  /// the contract keeps the row's last window + 1 visible keys (its r-th visible key sits at
  /// position r); on the columns every row sees (a tree's prefix, DevicePlan::mask_free_cols) r
  /// is the key itself, so this is that rule while the window reaches back into them (window >=
  /// the row's visible keys past those columns, a tree's depth): CudaBatchAttention::run refuses
  /// shorter windows. No scan for the rarer case: it cost the Hopper prefill 4-8 spilled bytes.
  PAGODA_MASK_HD int window_start(int qi) const {
    return (qpos != nullptr ? qpos[qi] : kv_len - qo_len + qi) - window;
  }

  /// visible() without the window (the custom bit, or causal).
  PAGODA_MASK_HD bool unwindowed(int qi, int kj) const {
    if (bits != nullptr) {
      const int64_t bit = static_cast<int64_t>(qi) * kv_len + kj;
      return ((bits[bit >> 3] >> (bit & 7)) & 1) != 0;
    }
    return !causal || kj <= kv_len - qo_len + qi;
  }

  PAGODA_MASK_HD bool visible(int qi, int kj) const {
    return unwindowed(qi, kj) && (window < 0 || kj >= window_start(qi));
  }
};

/// For packed row pr (query token pr / G, G an int or a FastDiv; no row when pr >= rows) and the
/// keys c0 + 8j + e of one lane (j < kNT, e < 2; c0 >= 0), calls hide(j, e) for every key the row
/// does not see or that is at or past hi (hi <= kv_len). Without a custom mask the keys it sees are
/// one interval [window start, min(hi, causal limit)), so a key costs two compares with constant
/// offsets; a custom mask's bits for the lane's keys are bits sh + e of the byte pairs (j, j + 1)
/// of the kNT + 1 bytes from bit p0 = qi * kv_len + c0 on (sh = p0 & 7). Byte k is read only when
/// it holds a key below the interval's end (offset max(8k - sh, 0)): such a key is a bit of the
/// request's mask (qi < qo_len, key < kv_len), so no read leaves the request's mask bytes, also
/// for rows past `rows` (none is read).
template <int kNT, typename GDiv, typename Hide>
PAGODA_MASK_HD void hide_row_keys(const MaskInfo& mk, int pr, const GDiv& G, int c0, int hi,
                                  int rows, Hide&& hide) {
  const int tok = div_by(pr, G);
  const int diag = mk.kv_len - mk.qo_len + tok;  // the causal limit
#if !defined(__CUDA_ARCH__)
  using std::min;  // the device pass takes CUDA's min(int, int)
#endif
  int lim = mk.causal && mk.bits == nullptr ? min(hi, diag + 1) : hi;
  if (pr >= rows) lim = c0;  // no such row: nothing seen
  const int hi_off = lim - c0;  // seen: off < hi_off
  // and off >= lo_off (a row past `rows` reads no position: it sees nothing anyway)
  const int lo_off = mk.window >= 0 && pr < rows ? mk.window_start(tok) - c0 : -1;
  if (mk.bits == nullptr) {
    PAGODA_MASK_UNROLL
    for (int j = 0; j < kNT; ++j) {
      PAGODA_MASK_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int off = j * 8 + e;
        if (off >= hi_off || off < lo_off) hide(j, e);
      }
    }
    return;
  }
  const int64_t p0 = int64_t(tok) * mk.kv_len + c0;
  const uint8_t* span = mk.bits + (p0 >> 3);
  const int sh = static_cast<int>(p0 & 7);
  auto byte = [&](int k) -> uint32_t {
    return (k == 0 ? 0 : 8 * k - sh) < hi_off ? uint32_t(span[k]) : 0u;
  };
  uint32_t cur = byte(0);
  PAGODA_MASK_UNROLL
  for (int j = 0; j < kNT; ++j) {
    const uint32_t nxt = byte(j + 1);
    const uint32_t pair = (cur | (nxt << 8)) >> sh;
    cur = nxt;
    PAGODA_MASK_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int off = j * 8 + e;
      if (off >= hi_off || off < lo_off || ((pair >> e) & 1u) == 0) hide(j, e);
    }
  }
}

}  // namespace pagoda::kernels::cuda::detail
