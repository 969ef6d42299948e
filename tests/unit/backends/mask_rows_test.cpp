/// hide_row_keys (kernels/cuda/mask_rows.h), the tile mask the sm90 prefill kernel runs, against
/// a per-key reference written from the definition (key >= hi, row past the tile's rows, or
/// MaskInfo::visible false: hidden). Random requests (causal or not, sliding windows, packed
/// custom masks of random and tree-like bits, with the planner's row positions and mask-free
/// columns, so windows start per row), GQA packing (group sizes 1..8, given as an int or
/// as a FastDiv), rows past the request, tile starts off any alignment and chunk ends short of
/// kv_len, at the kernel's 16 and 8 score n-tiles per lane. Each mask sits alone in a vector of
/// exactly its bytes, so a read past the request's mask is a heap overflow under
/// AddressSanitizer (CI's sanitizer stage runs this test).
/// Header-only code: no GPU, no CUDA toolkit. Seed printed; PAGODA_TEST_SEED replays it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/kernels/cuda/mask_rows.h"
#include "test_seed.h"

namespace pagoda::kernels::cuda::detail {
namespace {

/// One request's mask, with its custom bits (if any) in a vector of exactly their bytes, and
/// their rows' positions (visible keys - 1) and mask-free columns as the CUDA planner makes them.
struct Request {
  MaskInfo mk;
  std::vector<uint8_t> bits;
  std::vector<int32_t> qpos;
  int free_cols = 0;  ///< leading columns every row sees
};

bool bit_of(const Request& r, int qi, int kj) {
  const int64_t bit = int64_t(qi) * r.mk.kv_len + kj;
  return ((r.bits[static_cast<size_t>(bit >> 3)] >> (bit & 7)) & 1) != 0;
}

/// Fills qpos (each row's visible keys - 1) and free_cols (leading columns every row sees).
void set_positions(Request& r) {
  r.qpos.assign(static_cast<size_t>(r.mk.qo_len), -1);
  int free_cols = r.mk.kv_len;
  for (int qi = 0; qi < r.mk.qo_len; ++qi) {
    int lead = 0;
    while (lead < r.mk.kv_len && bit_of(r, qi, lead)) ++lead;
    free_cols = std::min(free_cols, lead);
    for (int kj = 0; kj < r.mk.kv_len; ++kj) r.qpos[static_cast<size_t>(qi)] += bit_of(r, qi, kj);
  }
  r.mk.bits = r.bits.data();
  r.mk.qpos = r.qpos.data();
  r.free_cols = free_cols;
}

Request random_request(std::mt19937& rng, bool custom) {
  Request r;
  r.mk.qo_len = 1 + static_cast<int>(rng() % 70);
  r.mk.kv_len = r.mk.qo_len + static_cast<int>(rng() % 600);
  r.mk.causal = rng() % 4 != 0;
  r.mk.window = rng() % 3 == 0 ? static_cast<int>(rng() % 200) : -1;
  if (custom) {
    const int64_t nbits = int64_t(r.mk.qo_len) * r.mk.kv_len;
    r.bits.assign(static_cast<size_t>((nbits + 7) / 8), 0);
    // Tree-like rows (a prefix every row sees, then a random subset of the drafts) or noise.
    const bool tree = rng() % 2 == 0;
    const int prefix = r.mk.kv_len - r.mk.qo_len;
    for (int qi = 0; qi < r.mk.qo_len; ++qi) {
      for (int kj = 0; kj < r.mk.kv_len; ++kj) {
        const bool on = tree ? (kj < prefix || kj == prefix + qi || (kj < prefix + qi && rng() % 2))
                             : rng() % 2 == 0;
        const int64_t bit = int64_t(qi) * r.mk.kv_len + kj;
        if (on) r.bits[static_cast<size_t>(bit >> 3)] |= uint8_t(1u << (bit & 7));
      }
    }
    set_positions(r);
  }
  return r;
}

template <int kNT>
void check_random_rows(uint32_t seed, int cases) {
  std::mt19937 rng(seed);
  int hidden_total = 0, seen_total = 0;
  for (int c = 0; c < cases; ++c) {
    const Request r = random_request(rng, c % 2 == 1);
    const MaskInfo& mk = r.mk;
    const int G = 1 + static_cast<int>(rng() % 8);  // group sizes 1..8, powers of two or not
    const FastDiv gdiv = FastDiv::make(G);
    const int rows = mk.qo_len * G;
    for (int trial = 0; trial < 24; ++trial) {
      // A split-KV chunk ends anywhere in (0, kv_len]; a tile starts anywhere before it (lo is
      // the window start or the chunk start, not aligned), the lane at 2 (lane % 4) past it.
      const int hi = trial % 3 == 0 ? mk.kv_len : 1 + static_cast<int>(rng() % mk.kv_len);
      const int kb0 = static_cast<int>(rng() % (hi + 8));
      const int c0 = kb0 + 2 * static_cast<int>(rng() % 4);
      const int pr = static_cast<int>(rng() % (rows + 40));  // rows past the request too
      bool hidden[kNT][2] = {};
      auto hide = [&](int j, int e) {
        ASSERT_FALSE(hidden[j][e]) << "key hidden twice";
        hidden[j][e] = true;
      };
      // The group size as an int (a division) or a FastDiv (the sm90 kernel's), in turn.
      if (trial % 2 == 0) {
        hide_row_keys<kNT>(mk, pr, G, c0, hi, rows, hide);
      } else {
        hide_row_keys<kNT>(mk, pr, gdiv, c0, hi, rows, hide);
      }
      for (int j = 0; j < kNT; ++j) {
        for (int e = 0; e < 2; ++e) {
          const int kj = c0 + 8 * j + e;
          const bool ref = kj >= hi || pr >= rows || !mk.visible(pr / G, kj);
          ASSERT_EQ(hidden[j][e], ref)
              << "seed " << seed << " case " << c << ": qo_len " << mk.qo_len << " kv_len "
              << mk.kv_len << " causal " << mk.causal << " window " << mk.window << " custom "
              << (mk.bits != nullptr) << " G " << G << " row " << pr << " hi " << hi << " c0 " << c0
              << " key " << kj;
          (ref ? hidden_total : seen_total) += 1;
        }
      }
    }
  }
  // Both outcomes occur often: the comparison above is not vacuous.
  EXPECT_GT(hidden_total, cases);
  EXPECT_GT(seen_total, cases);
}

TEST(MaskRows, MatchesVisibleOnRandomRows128Keys) {
  const pagoda::testing::TestSeed seed;
  check_random_rows<16>(seed, 600);
}

TEST(MaskRows, MatchesVisibleOnRandomRows64Keys) {
  const pagoda::testing::TestSeed seed;
  check_random_rows<8>(seed + 1, 600);
}

// Under a custom mask the window keeps a row's last W + 1 visible keys (a tree node at position
// prefix + depth, not at its index; issue 52): MaskInfo::visible against that definition on
// random trees (prefix, then each node's ancestors and itself), for every window the CUDA
// backend accepts (from the deepest row's depth up: CudaBatchAttention::run refuses shorter
// ones); and the mask-free form the kernels run on the columns every row sees (bits cleared,
// positions kept) agrees with it there.
TEST(MaskRows, CustomMaskWindowKeepsTheLastVisibleKeys) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed + 2);
  int cut = 0;
  for (int c = 0; c < 400; ++c) {
    Request r;
    const int n = 2 + static_cast<int>(rng() % 14), prefix = static_cast<int>(rng() % 60);
    r.mk.qo_len = n;
    r.mk.kv_len = prefix + n;
    r.mk.causal = true;  // ignored under a custom mask
    std::vector<int> parent(static_cast<size_t>(n), -1);
    for (int i = 1; i < n; ++i) parent[static_cast<size_t>(i)] = static_cast<int>(rng() % i);
    r.bits.assign(static_cast<size_t>((int64_t(n) * r.mk.kv_len + 7) / 8), 0);
    auto set = [&](int qi, int kj) {
      const int64_t bit = int64_t(qi) * r.mk.kv_len + kj;
      r.bits[static_cast<size_t>(bit >> 3)] |= uint8_t(1u << (bit & 7));
    };
    for (int i = 0; i < n; ++i) {
      for (int kj = 0; kj < prefix; ++kj) set(i, kj);
      for (int a = i; a >= 0; a = parent[static_cast<size_t>(a)]) set(i, prefix + a);
    }
    set_positions(r);
    int tail = 0;  // visible keys past the mask-free columns, at most (the deepest row's depth)
    for (int i = 0; i < n; ++i) tail = std::max(tail, r.qpos[static_cast<size_t>(i)] + 1 - r.free_cols);
    r.mk.window = tail + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      int depth = 0;
      for (int a = parent[static_cast<size_t>(i)]; a >= 0; a = parent[static_cast<size_t>(a)]) ++depth;
      ASSERT_EQ(r.qpos[static_cast<size_t>(i)], prefix + depth);
      int after = 0;  // visible keys after kj
      for (int kj = r.mk.kv_len - 1; kj >= 0; --kj) {
        const bool in_mask = bit_of(r, i, kj);
        const bool ref = in_mask && after <= r.mk.window;
        ASSERT_EQ(r.mk.visible(i, kj), ref) << "seed " << seed << " case " << c << " node " << i
                                            << " key " << kj << " window " << r.mk.window;
        cut += in_mask && !ref;
        after += in_mask;
        if (kj < r.free_cols) {
          MaskInfo free = r.mk;
          free.bits = nullptr;
          free.causal = false;
          ASSERT_EQ(free.visible(i, kj), ref) << "mask-free column " << kj << " case " << c;
        }
      }
    }
  }
  EXPECT_GT(cut, 400);  // the window hid keys (prefix and ancestors) often
}

TEST(MaskRows, ByteBoundariesOfACustomMask) {
  // Every bit offset of the row start (p0 & 7 = 0..7) with the last key of the request in the
  // lane's span: the byte pair of the last key may be the mask's last byte.
  for (int kv_len = 9; kv_len <= 40; ++kv_len) {
    Request r;
    r.mk.qo_len = 3;
    r.mk.kv_len = kv_len;
    r.mk.causal = false;
    r.bits.assign(static_cast<size_t>((3 * kv_len + 7) / 8), 0xA5);
    set_positions(r);
    for (int c0 = 0; c0 < kv_len; ++c0) {
      for (int pr = 0; pr < 4; ++pr) {  // pr 3: no such row
        bool hidden[16][2] = {};
        hide_row_keys<16>(r.mk, pr, 1, c0, kv_len, 3, [&](int j, int e) { hidden[j][e] = true; });
        for (int j = 0; j < 16; ++j) {
          for (int e = 0; e < 2; ++e) {
            const int kj = c0 + 8 * j + e;
            const bool ref = kj >= kv_len || pr >= 3 || !r.mk.visible(pr, kj);
            ASSERT_EQ(hidden[j][e], ref) << "kv_len " << kv_len << " c0 " << c0 << " row " << pr;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels::cuda::detail
