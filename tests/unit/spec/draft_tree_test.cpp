// Draft trees, the EAGLE tree builder and the n-gram drafter against independent brute-force
// constructions on random inputs (seeds printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "pagoda/core/error.h"
#include "pagoda/spec/draft_tree.h"
#include "pagoda/spec/ngram.h"
#include "pagoda/spec/tree_builder.h"
#include "test_seed.h"

namespace pagoda::spec {
namespace {

DraftTree random_tree(std::mt19937_64& rng, int n) {
  DraftTree t = DraftTree::root_only(static_cast<int32_t>(rng() % 50));
  for (int i = 1; i < n; ++i)
    t.add(static_cast<int32_t>(rng() % 50), static_cast<int32_t>(rng() % static_cast<uint64_t>(i)));
  return t;
}

/// Ancestor-or-self by walking parents (independent of append_verify_mask's loop).
bool is_ancestor_or_self(const DraftTree& t, int a, int i) {
  std::set<int> anc;
  for (int x = i; x != -1; x = t.parents[x]) anc.insert(x);
  return anc.count(a) > 0;
}

TEST(DraftTree, MaskDepthsAndRetrieveMatchBruteForce) {
  const uint64_t seed = 1234;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 50; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 20);
    const int prefix = static_cast<int>(rng() % 9);
    const DraftTree t = random_tree(rng, n);
    std::vector<uint8_t> mask = {7, 7};  // appended after existing content
    append_verify_mask(t, prefix, mask);
    ASSERT_EQ(mask.size(), 2u + static_cast<size_t>(n * (prefix + n)));
    const auto depth = t.depths();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(depth[i], static_cast<int>(t.path_to(i).size()) - 1);
      for (int c = 0; c < prefix + n; ++c) {
        const bool want = c < prefix || is_ancestor_or_self(t, c - prefix, i);
        ASSERT_EQ(mask[2 + static_cast<size_t>(i * (prefix + n) + c)], want ? 1 : 0)
            << "row " << i << " col " << c;
      }
    }
    // The rows of a frontier forward (nodes first..n−1, earlier ones cached): the same bits.
    const int first = static_cast<int>(rng() % static_cast<uint64_t>(n));
    std::vector<uint8_t> tail;
    append_verify_mask(t, prefix, tail, first);
    ASSERT_EQ(tail.size(), static_cast<size_t>((n - first) * (prefix + n)));
    for (int i = first; i < n; ++i) {
      for (int c = 0; c < prefix + n; ++c) {
        const bool want = c < prefix || is_ancestor_or_self(t, c - prefix, i);
        ASSERT_EQ(tail[static_cast<size_t>((i - first) * (prefix + n) + c)], want ? 1 : 0)
            << "first " << first << " row " << i << " col " << c;
      }
    }
    const RetrieveIndices r = retrieve_indices(t);
    for (int p = 0; p < n; ++p) {
      std::vector<int> want, got;
      for (int i = 1; i < n; ++i)
        if (t.parents[i] == p) want.push_back(i);
      for (int c = r.first_child[p]; c >= 0; c = r.next_sibling[c]) got.push_back(c);
      EXPECT_EQ(got, want) << "children of " << p;
    }
  }
}

TEST(DraftTree, BadTreesAreRejectedByName) {
  DraftTree t{{1, 2}, {-1, 1}};
  EXPECT_THROW(t.validate(), Error);
  std::vector<uint8_t> m;
  const DraftTree two{{1, 2}, {-1, 0}};
  EXPECT_THROW(append_verify_mask(two, 0, m, 2), Error);   // first_row past the last node
  EXPECT_THROW(append_verify_mask(two, 0, m, -1), Error);
  EXPECT_TRUE(m.empty());
  DraftTree u{{1, 2}, {-1}};
  EXPECT_THROW(u.validate(), Error);
  DraftTree v = DraftTree::root_only(3);
  EXPECT_THROW(v.add(1, 1), Error);
  EXPECT_THROW(pad_tree(v, 0), Error);
  pad_tree(v, 4);
  EXPECT_EQ(v.size(), 4);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(v.parents[i], 0);
}

/// Brute force EAGLE: enumerate, per step, every candidate with its cumulative score, keep the
/// beam by full sort; the final tree = the best D - 1 candidates.
struct BruteCand {
  int token;
  float score;
  int parent;  // candidate, -1 root
};

TEST(TreeBuilder, MatchesBruteForceBeamConstruction) {
  const uint64_t seed = 99;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> lp(-6.f, 0.f);
  for (int iter = 0; iter < 40; ++iter) {
    const int k = 1 + static_cast<int>(rng() % 4);
    const int steps = 1 + static_cast<int>(rng() % 5);
    const int d = 2 + static_cast<int>(rng() % 16);
    TreeBuilder tb(5, k, steps);
    std::vector<BruteCand> all;
    std::vector<int> beam = {-1};  // candidate ids of the frontier
    for (int s = 0; s < steps; ++s) {
      ASSERT_EQ(tb.frontier_size(), static_cast<int>(beam.size()));
      // The frontier nodes of the builder carry the beam candidates' tokens, in order.
      const DraftTree& bt = tb.beam_tree();
      for (size_t f = 0; f < beam.size(); ++f) {
        const int node = bt.size() - static_cast<int>(beam.size()) + static_cast<int>(f);
        EXPECT_EQ(bt.tokens[node], beam[f] < 0 ? 5 : all[beam[f]].token);
      }
      std::vector<Candidate> kids;
      std::vector<int> fresh;
      for (int f : beam) {
        std::vector<float> l(k);
        for (auto& x : l) x = lp(rng);
        std::sort(l.rbegin(), l.rend());
        for (int t = 0; t < k; ++t) {
          const int tok = static_cast<int>(rng() % 1000);
          kids.push_back({tok, l[t]});
          all.push_back({tok, (f < 0 ? 0.f : all[f].score) + l[t], f});
          fresh.push_back(static_cast<int>(all.size()) - 1);
        }
      }
      tb.expand(kids);
      std::stable_sort(fresh.begin(), fresh.end(),
                       [&](int a, int b) { return all[a].score > all[b].score; });
      fresh.resize(k);
      std::sort(fresh.begin(), fresh.end());
      beam = fresh;
    }
    EXPECT_TRUE(tb.done());
    EXPECT_THROW(tb.expand({}), Error);
    std::vector<int> order(all.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return all[a].score > all[b].score; });
    order.resize(std::min<size_t>(order.size(), static_cast<size_t>(d - 1)));
    std::sort(order.begin(), order.end());
    const DraftTree tree = tb.finish(d);
    tree.validate();
    ASSERT_EQ(tree.size(), static_cast<int>(order.size()) + 1);
    std::map<int, int> node_of;
    for (size_t i = 0; i < order.size(); ++i) node_of[order[i]] = static_cast<int>(i) + 1;
    for (size_t i = 0; i < order.size(); ++i) {
      const BruteCand& c = all[order[i]];
      EXPECT_EQ(tree.tokens[i + 1], c.token);
      EXPECT_EQ(tree.parents[i + 1], c.parent < 0 ? 0 : node_of.at(c.parent));
    }
  }
}

TEST(TreeBuilder, ChainWithTopkOne) {
  TreeBuilder tb(9, 1, 3);
  for (int s = 0; s < 3; ++s) tb.expand(std::vector<Candidate>{{10 + s, -0.5f}});
  const DraftTree t = tb.finish(8);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{9, 10, 11, 12}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(tb.finish(2).size(), 2);
  EXPECT_THROW(TreeBuilder(1, 0, 1), Error);
  EXPECT_THROW(TreeBuilder(1, 1, 0), Error);
  TreeBuilder bad(1, 1, 1);
  EXPECT_THROW(bad.expand(std::vector<Candidate>{{1, 0.5f}}), Error);
}

TEST(Ngram, TreeHoldsTheContinuationsOfEarlierMatches) {
  const NgramDrafter d(NgramConfig{.min_window = 2, .max_window = 3});
  //              0  1  2  3  4  5  6  7  8  9 10
  const std::vector<int32_t> ctx = {1, 2, 3, 4, 9, 2, 3, 7, 8, 2, 3};
  // Suffix (2, 3) occurs at 5 (continuation 7 8 2) and at 1 (continuation 4 9 2).
  const DraftTree t = d.propose(ctx, 2, 3, 16);
  t.validate();
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{3, 7, 8, 2, 4, 9, 2}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, 2, 0, 4, 5}));
  // topk 1: only the most recent continuation; budget 3: truncated.
  EXPECT_EQ(d.propose(ctx, 1, 3, 16).tokens, (std::vector<int32_t>{3, 7, 8, 2}));
  EXPECT_EQ(d.propose(ctx, 2, 3, 3).size(), 3);
  EXPECT_EQ(d.propose(ctx, 2, 1, 16).tokens, (std::vector<int32_t>{3, 7, 4}));
  // Nothing matches: the root alone.
  EXPECT_EQ(d.propose(std::vector<int32_t>{1, 2, 3, 4}, 2, 3, 8).size(), 1);
  EXPECT_THROW(d.propose(std::vector<int32_t>{}, 1, 1, 4), Error);
  EXPECT_THROW(NgramDrafter(NgramConfig{.min_window = 3, .max_window = 2}), Error);
}

/// The drafter's definition, window by window (longest first), every occurrence most recent
/// first, each continuation merged into the tree: the brute force the one-pass drafter must equal.
DraftTree ngram_by_windows(const std::vector<int32_t>& ctx, int min_w, int max_w, int topk,
                           int steps, int budget) {
  const int64_t n = static_cast<int64_t>(ctx.size());
  DraftTree t = DraftTree::root_only(ctx.back());
  for (int64_t w = std::min<int64_t>(max_w, n - 1); w >= min_w; --w) {
    for (int64_t p = n - w - 1; p >= 0; --p) {
      if (t.size() >= budget) return t;
      bool match = true;
      for (int64_t i = 0; i < w; ++i) match = match && ctx[p + i] == ctx[n - w + i];
      if (!match) continue;
      int32_t node = 0;
      for (int64_t k = p + w; k < n && k < p + w + steps && t.size() < budget; ++k) {
        int32_t found = -1, kids = 0;
        for (int32_t j = 1; j < t.size(); ++j) {
          if (t.parents[j] != node) continue;
          ++kids;
          if (t.tokens[j] == ctx[k]) found = j;
        }
        if (found >= 0) {
          node = found;
          continue;
        }
        if (kids >= topk) break;
        node = t.add(ctx[k], node);
      }
    }
  }
  return t;
}

TEST(Ngram, OnePassEqualsTheWindowByWindowDefinition) {
  const uint64_t seed = 90210;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 400; ++iter) {
    const int min_w = 1 + static_cast<int>(rng() % 3);
    const int max_w = min_w + static_cast<int>(rng() % 5);
    const NgramDrafter d(NgramConfig{.min_window = min_w, .max_window = max_w});
    std::vector<int32_t> ctx(1 + rng() % 300);
    const int vocab = 2 + static_cast<int>(rng() % 6);  // small: many overlapping matches
    for (auto& x : ctx) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    const int k = 1 + static_cast<int>(rng() % 4), steps = 1 + static_cast<int>(rng() % 6);
    const int budget = 1 + static_cast<int>(rng() % 24);
    const DraftTree got = d.propose(ctx, k, steps, budget);
    const DraftTree want = ngram_by_windows(ctx, min_w, max_w, k, steps, budget);
    ASSERT_EQ(got.tokens, want.tokens) << "iter " << iter;
    ASSERT_EQ(got.parents, want.parents) << "iter " << iter;
  }
}

TEST(Ngram, EveryPathOccursInTheContext) {
  const uint64_t seed = 4242;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const NgramDrafter d;
  for (int iter = 0; iter < 100; ++iter) {
    std::vector<int32_t> ctx(5 + rng() % 60);
    for (auto& x : ctx) x = static_cast<int32_t>(rng() % 4);
    const int k = 1 + static_cast<int>(rng() % 4), steps = 1 + static_cast<int>(rng() % 5);
    const int budget = 1 + static_cast<int>(rng() % 12);
    const DraftTree t = d.propose(ctx, k, steps, budget);
    t.validate();
    ASSERT_LE(t.size(), budget);
    EXPECT_EQ(t.tokens[0], ctx.back());
    const auto depth = t.depths();
    for (int i = 0; i < t.size(); ++i) {
      ASSERT_LE(depth[i], steps);
      int kids = 0;
      for (int j = 1; j < t.size(); ++j) kids += t.parents[j] == i;
      ASSERT_LE(kids, k);
      // Root + path tokens are a contiguous run of the context (an earlier occurrence).
      const auto path = t.path_to(i);
      std::vector<int32_t> seq;
      for (int n : path) seq.push_back(t.tokens[n]);
      bool found = false;
      for (size_t p = 0; p + seq.size() <= ctx.size() && !found; ++p)
        found = std::equal(seq.begin(), seq.end(), ctx.begin() + static_cast<long>(p));
      EXPECT_TRUE(found) << "path to node " << i;
    }
  }
}

// top_candidates vs a brute force (stable sort of every id by logit, long-double log-softmax) on
// random rows with many exact ties (logits drawn from a small set), vocabulary 50,000.
TEST(TopCandidates, MatchesAFullSort) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 6; ++trial) {
    const size_t vocab = trial < 3 ? 50000 : 1 + rng() % 40;
    std::vector<float> logits(vocab);
    for (auto& l : logits) l = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 8.f;
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    long double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<long double>(l) - logits[ids[0]]);
    const long double lse = logits[ids[0]] + std::log(sum);
    for (int32_t k : {1, 4, 16}) {
      if (static_cast<size_t>(k) > vocab) continue;
      std::vector<Candidate> out = {{7, -1.f}};  // appends after what is there
      top_candidates(logits, k, out);
      ASSERT_EQ(out.size(), static_cast<size_t>(k) + 1);
      EXPECT_EQ(out[0].token, 7);
      for (int32_t t = 0; t < k; ++t) {
        EXPECT_EQ(out[static_cast<size_t>(t) + 1].token, ids[static_cast<size_t>(t)])
            << "vocab " << vocab << " k " << k << " rank " << t;
        EXPECT_NEAR(out[static_cast<size_t>(t) + 1].logprob,
                    static_cast<double>(std::min<long double>(logits[ids[t]] - lse, 0)), 1e-5);
      }
    }
  }
  std::vector<Candidate> out;
  EXPECT_THROW(top_candidates(std::vector<float>(3, 0.f), 4, out), Error);
  EXPECT_THROW(top_candidates(std::vector<float>(3, 0.f), 0, out), Error);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace pagoda::spec
