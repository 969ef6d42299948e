// disagg: the page write ops of random page maps against a page-by-page copy, the UCX engine on
// loopback (random page maps, page sizes 1 and 16, several regions: destination pages equal the
// source pages byte for byte, every other byte untouched, checksums agree), and its input checks;
// the handshake layout's mismatch messages.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/disagg/kv_layout.h"
#include "pagoda/disagg/kv_transfer.h"

namespace pagoda::disagg {
namespace {

/// Byte buffers standing in for a KV pool: `regions` regions of `pages` pages each.
struct Pool {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<uint64_t> page_bytes;
  Pool(int regions, int pages, std::span<const uint64_t> pb, std::mt19937_64& rng)
      : page_bytes(pb.begin(), pb.end()) {
    for (int r = 0; r < regions; ++r) {
      bufs.emplace_back(static_cast<size_t>(pages) * page_bytes[static_cast<size_t>(r)]);
      for (auto& b : bufs.back()) b = static_cast<std::byte>(rng());
    }
  }
  std::vector<MemRegion> regions() {
    std::vector<MemRegion> out;
    for (auto& b : bufs) out.push_back({b.data(), b.size()});
    return out;
  }
};

/// `n` distinct random pages in [1, pages), with runs (consecutive ids) mixed in.
std::vector<PageId> random_pages(int n, int pages, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(pages - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<size_t>(n));
  if (rng() % 2 == 0) std::sort(ids.begin(), ids.begin() + n / 2);  // contiguous runs
  std::vector<PageId> out;
  for (int32_t i : ids) out.emplace_back(i);
  return out;
}

/// The reference: dst pages[i] = src pages[i], one page at a time.
void copy_pages(Pool& src, Pool& dst, std::span<const PageId> sp, std::span<const PageId> dp) {
  for (size_t r = 0; r < src.bufs.size(); ++r)
    for (size_t i = 0; i < sp.size(); ++i)
      std::memcpy(dst.bufs[r].data() + dp[i].value() * dst.page_bytes[r],
                  src.bufs[r].data() + sp[i].value() * src.page_bytes[r], src.page_bytes[r]);
}

TEST(PageWriteOps, MergedRunsCopyWhatAPageByPageCopyDoes) {
  const uint64_t seed = 0xD15A66;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int pages = 64;
    const std::vector<uint64_t> pb = {16, 48, 16};
    Pool src(3, pages, pb, rng), dst(3, pages, pb, rng), want(3, pages, pb, rng);
    want.bufs = dst.bufs;
    const int n = 1 + static_cast<int>(rng() % 40);
    const auto sp = random_pages(n, pages, rng), dp = random_pages(n, pages, rng);
    copy_pages(src, want, sp, dp);
    const auto ops = page_write_ops(sp, dp, pb);
    EXPECT_LE(ops.size(), static_cast<size_t>(n) * 3);
    for (const WriteOp& op : ops)
      std::memcpy(dst.bufs[op.dst_region].data() + op.dst_offset,
                  src.bufs[op.src_region].data() + op.src_offset, op.bytes);
    EXPECT_EQ(dst.bufs, want.bufs) << "trial " << trial;
    EXPECT_EQ(pages_checksum(src.regions(), pb, sp), pages_checksum(dst.regions(), pb, dp));
  }
  const std::vector<PageId> one = {PageId{1}};
  const std::vector<uint64_t> pb = {8};
  EXPECT_THROW(page_write_ops(one, {}, pb), Error);
}

TEST(UcxTransfer, LoopbackWritesExactlyTheMappedPages) {
  if (!have_ucx_transfer()) GTEST_SKIP() << "UCX not in this build";
  const uint64_t seed = 0x0C5;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int page_size : {1, 16}) {
    // A small KV pool's shape: 4 layers × (K, V), 2 heads × 64 dims of f32 per row.
    const uint64_t row = 2 * 64 * 4;
    const std::vector<uint64_t> pb(8, row * static_cast<uint64_t>(page_size));
    const int pages = page_size == 1 ? 600 : 48;
    Pool src(8, pages, pb, rng), dst(8, pages, pb, rng), want(8, pages, pb, rng);
    want.bufs = dst.bufs;
    auto sender = make_ucx_transfer(src.regions());
    auto receiver = make_ucx_transfer(dst.regions());
    EXPECT_EQ(sender->name(), "ucx");
    for (int trial = 0; trial < 4; ++trial) {
      const int n = 1 + static_cast<int>(rng() % static_cast<uint64_t>(pages / 2));
      const auto sp = random_pages(n, pages, rng), dp = random_pages(n, pages, rng);
      copy_pages(src, want, sp, dp);
      const auto ops = page_write_ops(sp, dp, pb);
      const TransferResult r = sender->write(receiver->descriptor(), ops, 30);
      ASSERT_TRUE(r.ok) << r.error;
      uint64_t bytes = 0;
      for (const WriteOp& op : ops) bytes += op.bytes;
      EXPECT_EQ(r.bytes, bytes);
      EXPECT_EQ(dst.bufs, want.bufs) << "page size " << page_size << " trial " << trial;
      EXPECT_EQ(pages_checksum(src.regions(), pb, sp), pages_checksum(dst.regions(), pb, dp));
    }
    // Bad input: an op past the peer's region, a malformed descriptor; nothing is written.
    WriteOp past{.src_region = 0, .src_offset = 0, .dst_region = 0,
                 .dst_offset = dst.bufs[0].size() - 8, .bytes = 16};
    EXPECT_THROW(sender->write(receiver->descriptor(), std::span(&past, 1), 5), Error);
    WriteOp bad_region{.src_region = 0, .src_offset = 0, .dst_region = 99, .dst_offset = 0,
                       .bytes = 8};
    EXPECT_THROW(sender->write(receiver->descriptor(), std::span(&bad_region, 1), 5), Error);
    std::vector<std::byte> junk(40, std::byte{7});
    EXPECT_THROW(sender->write(junk, {}, 5), Error);
    EXPECT_EQ(dst.bufs, want.bufs);
  }
}

TEST(KvLayout, MismatchNamesTheFirstDifferingField) {
  const KvLayout a{.model = "m", .weights = 0, .dtype = DType::kF32, .kv_dtype = DType::kF32,
                   .page_size = 16, .num_layers = 2, .num_kv_heads = 2, .head_dim = 64,
                   .head_dim_v = 64};
  EXPECT_EQ(layout_mismatch(a, a), "");
  KvLayout b = a;
  b.page_size = 1;
  EXPECT_EQ(layout_mismatch(a, b), "page size: 16 here, 1 on the peer");
  b = a;
  b.kv_dtype = DType::kBF16;
  EXPECT_NE(layout_mismatch(a, b).find("KV dtype"), std::string::npos);
  b = a;
  b.model = "other";
  EXPECT_NE(layout_mismatch(a, b).find("model"), std::string::npos);
  b = a;
  b.num_kv_heads = 4;
  EXPECT_NE(layout_mismatch(a, b).find("KV heads"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::disagg
