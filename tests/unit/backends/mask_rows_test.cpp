/// hide_row_keys (kernels/cuda/mask_rows.h), the tile mask the sm90 prefill kernel runs, against
/// a per-key reference written from the definition (key >= hi, row past the tile's rows, or
/// MaskInfo::visible false: hidden). Random requests (causal or not, sliding windows, packed
/// custom masks of random and tree-like bits), GQA packing (group sizes 1..8, given as an int or
/// as a FastDiv), rows past the request, tile starts off any alignment and chunk ends short of
/// kv_len, at the kernel's 16 and 8 score n-tiles per lane. Each mask sits alone in a vector of
/// exactly its bytes, so a read past the request's mask is a heap overflow under
/// AddressSanitizer (CI's sanitizer stage runs this test).
/// Header-only code: no GPU, no CUDA toolkit. Seed printed; PAGODA_TEST_SEED overrides it.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/kernels/cuda/mask_rows.h"
#include "seed.h"

namespace pagoda::kernels::cuda::detail {
namespace {

using pagoda::test::test_seed;

/// One request's mask, with its custom bits (if any) in a vector of exactly their bytes.
struct Request {
  MaskInfo mk;
  std::vector<uint8_t> bits;
};

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
    r.mk.bits = r.bits.data();
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
  const uint32_t seed = test_seed();
  std::printf("mask_rows seed %u (PAGODA_TEST_SEED to re-run)\n", seed);
  check_random_rows<16>(seed, 600);
}

TEST(MaskRows, MatchesVisibleOnRandomRows64Keys) {
  const uint32_t seed = test_seed() + 1;
  std::printf("mask_rows seed %u (PAGODA_TEST_SEED to re-run)\n", seed - 1);
  check_random_rows<8>(seed, 600);
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
    r.mk.bits = r.bits.data();
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
