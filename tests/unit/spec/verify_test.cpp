// Verification: greedy acceptance against a brute-force walk, and exact rejection sampling
// checked statistically (fixed seed, chi-square) against the target distributions — including a
// deliberately wrong sampler the same test must reject.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/spec/verify.h"

namespace pagoda::spec {
namespace {

TEST(GreedyAccept, MatchesBruteForceWalk) {
  const uint64_t seed = 31337;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 16);
    DraftTree t = DraftTree::root_only(0);
    for (int i = 1; i < n; ++i)
      t.add(static_cast<int32_t>(rng() % 3), static_cast<int32_t>(rng() % static_cast<uint64_t>(i)));
    std::vector<int32_t> target(static_cast<size_t>(n));
    for (auto& x : target) x = static_cast<int32_t>(rng() % 3);
    std::vector<int32_t> nodes, tokens;
    for (int x = 0;;) {
      int next = -1;
      for (int i = 1; i < n && next < 0; ++i)
        if (t.parents[i] == x && t.tokens[i] == target[x]) next = i;
      tokens.push_back(target[x]);
      if (next < 0) break;
      nodes.push_back(next);
      x = next;
    }
    const AcceptResult a = greedy_accept(t, target);
    EXPECT_EQ(a.nodes, nodes);
    EXPECT_EQ(a.tokens, tokens);
  }
  EXPECT_THROW(greedy_accept(DraftTree::root_only(1), std::vector<int32_t>{1, 2}), Error);
}

constexpr int kVocab = 8;

/// root(0) → a(3), b(5), c(3, a duplicate: never accepted once a is rejected); a → d(7), e(2);
/// b → f(1).
DraftTree stat_tree() {
  DraftTree t = DraftTree::root_only(0);
  const int a = t.add(3, 0), b = t.add(5, 0);
  t.add(3, 0);
  t.add(7, a);
  t.add(2, a);
  t.add(1, b);
  return t;
}

double chi2(const std::vector<int64_t>& obs, const std::vector<double>& p) {
  int64_t n = 0;
  for (int64_t o : obs) n += o;
  double c = 0.0;
  for (size_t i = 0; i < obs.size(); ++i) {
    if (p[i] == 0.0) {
      if (obs[i] != 0) return 1e30;
      continue;
    }
    const double e = static_cast<double>(n) * p[i];
    c += (static_cast<double>(obs[i]) - e) * (static_cast<double>(obs[i]) - e) / e;
  }
  return c;
}

using Sampler = std::function<AcceptResult(const DraftTree&,
                                           const std::function<std::span<const double>(int32_t)>&,
                                           const std::function<double()>&)>;

/// Max chi-square (7 degrees of freedom) over: the first token vs p_root, the second given a / b
/// vs p_a / p_b, the third given a→d vs p_d.
double worst_chi2(const Sampler& sampler, uint64_t seed, int trials) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> p(7, std::vector<double>(kVocab));
  std::gamma_distribution<double> g(0.7);
  for (auto& row : p) {
    double s = 0.0;
    for (auto& x : row) s += (x = g(rng));
    for (auto& x : row) x /= s;
  }
  p[1][4] = 0.0;  // a zero-probability token: must never be emitted after a
  double s1 = 0.0;
  for (double x : p[1]) s1 += x;
  for (auto& x : p[1]) x /= s1;
  const DraftTree t = stat_tree();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> first(kVocab), after_a(kVocab), after_b(kVocab), after_ad(kVocab);
  for (int i = 0; i < trials; ++i) {
    const AcceptResult r = sampler(
        t, [&](int32_t node) { return std::span<const double>(p[static_cast<size_t>(node)]); },
        [&] { return u(rng); });
    ++first[r.tokens[0]];
    if (r.tokens.size() >= 2 && r.tokens[0] == 3) ++after_a[r.tokens[1]];
    if (r.tokens.size() >= 2 && r.tokens[0] == 5) ++after_b[r.tokens[1]];
    if (r.tokens.size() >= 3 && r.tokens[0] == 3 && r.tokens[1] == 7) ++after_ad[r.tokens[2]];
    // Structure: every token but the last is an accepted node's token.
    EXPECT_EQ(r.tokens.size(), r.nodes.size() + 1);
  }
  return std::max({chi2(first, p[0]), chi2(after_a, p[1]), chi2(after_b, p[2]),
                   chi2(after_ad, p[4])});
}

TEST(SampleAccept, OutputDistributionIsTheTargets) {
  const uint64_t seed = 2026;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // chi-square(7) exceeds 24.3 with probability 0.001.
  const double c = worst_chi2(sample_accept, seed, 60000);
  std::printf("[stat] exact rule: worst chi-square %.2f (7 dof, limit 24.3)\n", c);
  EXPECT_LT(c, 24.3);
}

TEST(SampleAccept, TheTestCatchesAWrongRule) {
  // Accepting child c with probability p(c) without renormalising by the residual mass biases the
  // second candidate; the statistic above must see it.
  const Sampler wrong = [](const DraftTree& t,
                           const std::function<std::span<const double>(int32_t)>& probs,
                           const std::function<double()>& uniform) {
    AcceptResult out;
    int32_t x = 0;
    for (;;) {
      const auto p = probs(x);
      std::vector<double> residual(p.begin(), p.end());
      int32_t acc = -1;
      for (int32_t c = 1; c < t.size() && acc < 0; ++c) {
        if (t.parents[c] != x) continue;
        if (uniform() < residual[t.tokens[c]]) acc = c;
        residual[t.tokens[c]] = 0.0;
      }
      if (acc >= 0) {
        out.nodes.push_back(acc);
        out.tokens.push_back(t.tokens[acc]);
        x = acc;
        continue;
      }
      double m = 0.0;
      for (double v : residual) m += v;
      double r = uniform() * m, cum = 0.0;
      int32_t pick = 0;
      for (size_t i = 0; i < residual.size(); ++i) {
        cum += residual[i];
        if (residual[i] > 0.0) pick = static_cast<int32_t>(i);
        if (residual[i] > 0.0 && r < cum) break;
      }
      out.tokens.push_back(pick);
      return out;
    }
  };
  const double c = worst_chi2(wrong, 2026, 60000);
  std::printf("[stat] wrong rule: worst chi-square %.2f\n", c);
  EXPECT_GT(c, 24.3);
}

TEST(SampleAccept, RejectsADistributionWithoutMass) {
  const std::vector<double> zero(kVocab, 0.0);
  EXPECT_THROW(sample_accept(
                   stat_tree(), [&](int32_t) { return std::span<const double>(zero); },
                   [] { return 0.5; }),
               Error);
}

}  // namespace
}  // namespace pagoda::spec
