#pragma once
// Random structured-output token masks for the mask tests (host: model_tests, device:
// model_kernels_tests), kept as plain per-token booleans next to the packed words, and the
// reference masking written from the booleans (never from the bits).

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace pagoda::testing {

struct RandomTokenMasks {
  int64_t vocab = 0;
  int64_t words = 0;                        ///< per row: ceil(vocab / 32)
  std::vector<int32_t> rows;                ///< the masked logit rows, ascending
  std::vector<std::vector<bool>> allowed;   ///< [rows.size()][vocab]
  /// The packed masks (bit t % 32 of word t / 32); bits past vocab are random (poison: an
  /// implementation must ignore them).
  std::vector<uint32_t> packed;
};

/// Masks a random subset of `num_rows` logit rows (at least one masked and one not when
/// num_rows >= 2). Allowed sets cycle through one token, ~1%, ~50%, ~99% and all but one.
inline RandomTokenMasks random_token_masks(std::mt19937_64& rng, int64_t vocab, int num_rows) {
  RandomTokenMasks m{.vocab = vocab, .words = (vocab + 31) / 32};
  for (int r = 0; r < num_rows; ++r)
    if (r == 0 || (r != num_rows - 1 && rng() % 3 != 0)) m.rows.push_back(r);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < m.rows.size(); ++i) {
    std::vector<bool> ok(static_cast<size_t>(vocab));
    const auto pick = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    switch (i % 5) {
      case 0:  // exactly one token
        ok[static_cast<size_t>(pick)] = true;
        break;
      case 4:  // all but one
        ok.assign(ok.size(), true);
        ok[static_cast<size_t>(pick)] = false;
        break;
      default: {
        const double keep = i % 5 == 1 ? 0.01 : i % 5 == 2 ? 0.5 : 0.99;
        for (size_t t = 0; t < ok.size(); ++t) ok[t] = unit(rng) < keep;
        ok[static_cast<size_t>(pick)] = true;  // never empty
      }
    }
    std::vector<uint32_t> w(static_cast<size_t>(m.words), 0u);
    for (int64_t t = 0; t < vocab; ++t)
      if (ok[static_cast<size_t>(t)]) w[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
    if (const int64_t tail = vocab % 32; tail != 0)  // poison the bits past vocab
      w.back() |= static_cast<uint32_t>(rng()) & ~((1u << tail) - 1u);
    m.packed.insert(m.packed.end(), w.begin(), w.end());
    m.allowed.push_back(std::move(ok));
  }
  return m;
}

/// logits [.., vocab] with every token a mask does not allow set to -inf.
inline void reference_token_mask(std::vector<float>& logits, const RandomTokenMasks& m) {
  for (size_t i = 0; i < m.rows.size(); ++i)
    for (int64_t t = 0; t < m.vocab; ++t)
      if (!m.allowed[i][static_cast<size_t>(t)])
        logits[static_cast<size_t>(m.rows[i] * m.vocab + t)] = -INFINITY;
}

/// The lowest-id maximum of row `row` of logits among the tokens `ok` allows.
inline int32_t reference_masked_argmax(const std::vector<float>& logits, int64_t vocab,
                                       int64_t row, const std::vector<bool>& ok) {
  int32_t best = -1;
  for (int64_t t = 0; t < vocab; ++t) {
    if (!ok[static_cast<size_t>(t)]) continue;
    if (best < 0 || logits[static_cast<size_t>(row * vocab + t)] >
                        logits[static_cast<size_t>(row * vocab + best)])
      best = static_cast<int32_t>(t);
  }
  return best;
}

}  // namespace pagoda::testing
