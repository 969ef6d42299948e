#include <gtest/gtest.h>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::attention {
namespace {

using V = std::vector<int32_t>;

/// Page size 4: request A (row r1) on pages 5, 2 (positions 0..7), request B (row r2) on page 9.
struct Fixture {
  kv::ReqToTokenTable table{4, 32};
  ReqSlot a = *table.alloc(), b = *table.alloc();
  Fixture() {
    table.write(a, 0, V{20, 21, 22, 23, 8, 9, 10, 11});
    table.write(b, 0, V{36, 37, 38});
  }
};

TEST(PagedPlan, DecodePages) {
  Fixture f;
  ForwardBatch batch{.mode = ForwardMode::kDecode, .batch_size = 2,
                     .req_pool_indices = {f.a.value(), f.b.value()}, .seq_lens = {7, 3},
                     .out_cache_loc = {10, 38}};
  const PagedPlan p = build_paged_plan(batch, f.table, 4);
  EXPECT_EQ(p.page_size, 4);
  EXPECT_EQ(p.qo_indptr, (V{0, 1, 2}));
  EXPECT_EQ(p.kv_indptr, (V{0, 2, 3}));
  EXPECT_EQ(p.kv_indices, (V{5, 2, 9}));
  EXPECT_EQ(p.kv_last_page_len, (V{3, 3}));
}

TEST(PagedPlan, ExtendWithPrefixAndMixed) {
  Fixture f;
  ForwardBatch batch{.mode = ForwardMode::kMixed, .batch_size = 2,
                     .req_pool_indices = {f.a.value(), f.b.value()}, .seq_lens = {8, 3},
                     .extend_prefix_lens = {4, 2}, .extend_seq_lens = {4, 1},
                     .out_cache_loc = {8, 9, 10, 11, 38}};
  const PagedPlan p = build_paged_plan(batch, f.table, 4);
  EXPECT_EQ(p.qo_indptr, (V{0, 4, 5}));
  EXPECT_EQ(p.kv_indices, (V{5, 2, 9}));
  EXPECT_EQ(p.kv_last_page_len, (V{4, 3}));
  batch.extend_prefix_lens = {3, 2};  // 3 + 4 != 8
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
}

TEST(PagedPlan, DraftExtendRaggedAcceptedCounts) {
  Fixture f;
  // A accepted 3 tokens after a 5-token prefix (positions 5..7, slots 9..11 on page 2), B
  // accepted 1 after 2 (slot 38 on page 9).
  ForwardBatch batch{.mode = ForwardMode::kDraftExtend, .batch_size = 2,
                     .req_pool_indices = {f.a.value(), f.b.value()}, .seq_lens = {8, 3},
                     .extend_prefix_lens = {5, 2}, .extend_seq_lens = {3, 1},
                     .positions = {5, 6, 7, 2}, .out_cache_loc = {9, 10, 11, 38}};
  batch.spec.num_steps = 3;
  const PagedPlan p = build_paged_plan(batch, f.table, 4);
  EXPECT_EQ(p.page_size, 4);
  EXPECT_EQ(p.qo_indptr, (V{0, 3, 4}));
  EXPECT_EQ(p.kv_indptr, (V{0, 2, 3}));
  EXPECT_EQ(p.kv_indices, (V{5, 2, 9}));
  EXPECT_EQ(p.kv_last_page_len, (V{4, 3}));
  // No accepted token (not even the bonus) and more than num_steps + 1 are errors.
  batch.extend_prefix_lens = {8, 2};
  batch.extend_seq_lens = {0, 1};
  batch.positions = {2};
  batch.out_cache_loc = {38};
  try {
    build_paged_plan(batch, f.table, 4);
    ADD_FAILURE() << "a request with 0 accepted tokens was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("extend_seq_lens"), std::string::npos) << e.message();
  }
  batch.spec.num_steps = 2;
  batch.extend_prefix_lens = {4, 2};
  batch.extend_seq_lens = {4, 1};
  batch.positions = {4, 5, 6, 7, 2};
  batch.out_cache_loc = {8, 9, 10, 11, 38};
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
  batch.spec.num_steps = 3;
  EXPECT_NO_THROW(build_paged_plan(batch, f.table, 4));
}

TEST(PagedPlan, TargetVerifyPacksFullMask) {
  kv::ReqToTokenTable table(2, 16);
  const ReqSlot r = *table.alloc();
  table.write(r, 0, V{1, 2, 3, 4, 5});  // 2 committed + 3 draft tokens, page size 1
  // Tree: root, a (child of root), b (child of root). Rows: prefix 11, then draft bits.
  ForwardBatch batch{.mode = ForwardMode::kTargetVerify, .batch_size = 1,
                     .req_pool_indices = {r.value()}, .seq_lens = {2},
                     .extend_prefix_lens = {2}, .extend_seq_lens = {3},
                     .out_cache_loc = {3, 4, 5}};
  batch.spec.num_draft_tokens = 3;
  batch.spec.topk = 2;
  batch.spec.tree_mask = {1, 1, 1, 0, 0,  //
                          1, 1, 1, 1, 0,  //
                          1, 1, 1, 0, 1};
  const PagedPlan p = build_paged_plan(batch, table, 1);
  EXPECT_EQ(p.qo_indptr, (V{0, 3}));
  EXPECT_EQ(p.kv_last_page_len, (V{1}));
  // Bits 0..14 little-endian: rows 11100 11110 11101; byte 0 = bits 0-7 (LSB first).
  ASSERT_EQ(p.custom_mask.size(), 2u);
  EXPECT_EQ(p.custom_mask[0], 0b11100111);
  EXPECT_EQ(p.custom_mask[1], 0b01011101);  // bits 8..14: 1 0 | 1 1 1 0 1
  EXPECT_EQ(p.mask_indptr, (std::vector<int64_t>{0, 2}));
  batch.spec.tree_mask.pop_back();
  EXPECT_THROW(build_paged_plan(batch, table, 1), Error);
  batch.spec.tree_mask.push_back(0);  // node b cannot see itself
  EXPECT_THROW(build_paged_plan(batch, table, 1), Error);
}

TEST(PagedPlan, DraftStepFallsBackToTokenGranularity) {
  Fixture f;
  // Request A committed 6 tokens (pages 5, 2; last page half full); 2 branches, 2 steps.
  ForwardBatch batch{.mode = ForwardMode::kDecode, .batch_size = 1,
                     .req_pool_indices = {f.a.value()}, .seq_lens = {6},
                     .out_cache_loc = {30, 51}};
  batch.spec.topk = 2;
  batch.spec.num_steps = 2;
  batch.spec.draft_step = 1;
  batch.spec.draft_slots = {10, 11, 50, 51};  // branch 0 continues page 2; branch 1 does not
  PagedPlan p = build_paged_plan(batch, f.table, 4);
  EXPECT_EQ(p.page_size, 1);
  EXPECT_EQ(p.qo_indptr, (V{0, 1, 2}));
  EXPECT_EQ(p.kv_indices, (V{20, 21, 22, 23, 8, 9, 10, 11, 20, 21, 22, 23, 8, 9, 50, 51}));
  EXPECT_EQ(p.kv_last_page_len, (V{1, 1}));
  batch.spec.draft_slots = {10, 11, 10, 11};  // both branches page-contiguous: stays paged
  p = build_paged_plan(batch, f.table, 4);
  EXPECT_EQ(p.page_size, 4);
  EXPECT_EQ(p.kv_indices, (V{5, 2, 5, 2}));
  batch.spec.draft_slots.pop_back();
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
}

TEST(PagedPlan, NonContiguousRequestIsAnError) {
  kv::ReqToTokenTable table(2, 16);
  const ReqSlot r = *table.alloc();
  table.write(r, 0, V{8, 9, 14});
  ForwardBatch batch{.mode = ForwardMode::kDecode, .batch_size = 1,
                     .req_pool_indices = {r.value()}, .seq_lens = {3}, .out_cache_loc = {14}};
  EXPECT_THROW(build_paged_plan(batch, table, 4), Error);
  EXPECT_NO_THROW(build_paged_plan(batch, table, 1));
}

TEST(PagedPlan, BadInputErrors) {
  Fixture f;
  ForwardBatch batch{.mode = ForwardMode::kDecode, .batch_size = 1, .req_pool_indices = {7},
                     .seq_lens = {3}, .out_cache_loc = {1}};
  try {
    build_paged_plan(batch, f.table, 4);
    ADD_FAILURE() << "row 7 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(e.message().find("req_pool_index 7"), std::string::npos) << e.message();
  }
  batch.req_pool_indices = {f.a.value()};
  batch.seq_lens = {40};  // beyond max_context_len 32
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
  batch.seq_lens = {0};  // decode must include the new token
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
  batch.seq_lens = {3};
  batch.out_cache_loc = {};
  EXPECT_THROW(build_paged_plan(batch, f.table, 4), Error);
  ForwardBatch idle;
  const PagedPlan p = build_paged_plan(idle, f.table, 4);
  EXPECT_EQ(p.qo_indptr, (V{0}));
}

}  // namespace
}  // namespace pagoda::attention
