// disagg: the page write ops of random page maps against a page-by-page copy, the UCX engine on
// loopback (random page maps, page sizes 1 and 16, several regions: destination pages equal the
// source pages byte for byte, every other byte untouched, checksums agree), and its input checks;
// the handshake layout's mismatch messages; the staged transfer (pool -> staging -> UCX ->
// staging -> pool on the CPU platform's copy streams) against a direct page copy of the pools,
// with a sender staging smaller than the request (chunks) and its failure exits.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/disagg/kv_layout.h"
#include "pagoda/disagg/kv_transfer.h"
#include "pagoda/disagg/staging.h"

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

/// A host KV pool (MHA, f32, 3 layers, 2 heads x 32 dims) of `pages` pages.
kv::KvPoolConfig staged_config(int page_size, int pages) {
  return kv::KvPoolConfig{.layout = kv::KvLayout::kMha, .num_layers = 3, .num_pages = pages,
                          .page_size = page_size, .dtype = DType::kF32, .num_kv_heads = 2,
                          .head_dim = 32};
}

/// Every K and V buffer of `pool`, as bytes (layer-major: K then V).
std::vector<std::span<std::byte>> buffers(const kv::KvPool& pool) {
  std::vector<std::span<std::byte>> out;
  const auto rows = static_cast<size_t>(pool.num_slots());
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    const LayerId layer{l};
    out.emplace_back(static_cast<std::byte*>(pool.k_view(layer).data()),
                     rows * static_cast<size_t>(pool.k_row_elems()) * sizeof(float));
    out.emplace_back(static_cast<std::byte*>(pool.v_view(layer).data()),
                     rows * static_cast<size_t>(pool.v_row_elems()) * sizeof(float));
  }
  return out;
}

TEST(StagedTransfer, MovesExactlyTheMappedPagesThroughChunkedStaging) {
  if (!have_ucx_transfer()) GTEST_SKIP() << "UCX not in this build";
  const uint64_t seed = 0x57A6ED;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto platform = platform::make_cpu_platform();
  for (int page_size : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page size " << page_size);
    const int pages = page_size == 1 ? 400 : 48;
    kv::KvPool src(staged_config(page_size, pages), platform->allocator());
    kv::KvPool dst(staged_config(page_size, pages), platform->allocator());
    for (std::span<std::byte> b : buffers(src))
      for (std::byte& x : b) x = static_cast<std::byte>(rng());
    dst.fill(std::nanf(""));
    // The sender's staging holds 7 pages: every room but the smallest goes in chunks.
    StagingPool out(src.config(), 7, platform->pinned_allocator());
    StagingPool in(dst.config(), pages, platform->pinned_allocator());
    auto sender = make_ucx_transfer(out.regions());
    auto receiver = make_ucx_transfer(in.regions());
    const std::vector<std::byte> peer = receiver->descriptor();
    for (int trial = 0; trial < 4; ++trial) {
      // The reference: the pools' buffers with pages dp[i] = sp[i], copied byte by byte.
      const int n = 1 + static_cast<int>(rng() % static_cast<uint64_t>(pages / 2));
      const auto sp = random_pages(n, pages + 1, rng), dp = random_pages(n, pages + 1, rng);
      std::vector<std::vector<std::byte>> want;
      for (std::span<std::byte> b : buffers(dst)) want.emplace_back(b.begin(), b.end());
      const auto from = buffers(src);
      for (size_t r = 0; r < want.size(); ++r) {
        const size_t page = from[r].size() / static_cast<size_t>(pages + 1);
        for (size_t i = 0; i < sp.size(); ++i)
          std::memcpy(want[r].data() + static_cast<size_t>(dp[i].value()) * page,
                      from[r].data() + static_cast<size_t>(sp[i].value()) * page, page);
      }
      // The receiver's staging pages are not contiguous: a random hold is leased first.
      StagingLease hold = in.take(static_cast<int32_t>(rng() % 5));
      StagingLease room = in.take(n);
      ASSERT_EQ(room.size(), static_cast<size_t>(n));
      const PutFn put = [&](std::span<const WriteOp> ops) { return sender->write(peer, ops, 30); };
      const StagedSend sent =
          send_staged(*platform, src, nullptr, out, sp, room.pages(), put, {},
                      std::chrono::steady_clock::now() + std::chrono::seconds(30));
      ASSERT_TRUE(sent.transfer.ok) << sent.transfer.error;
      EXPECT_FALSE(sent.stopped);
      EXPECT_EQ(sent.transfer.bytes,
                static_cast<uint64_t>(n) * 6 * 2 * 32 * sizeof(float) * static_cast<uint64_t>(page_size));
      EXPECT_EQ(sent.checksum, pages_checksum(in.regions(), in.page_bytes(), room.pages()));
      EXPECT_EQ(out.free_pages(), out.capacity());
      unstage(*platform, in, room.pages(), dst, dp, nullptr);
      const auto got = buffers(dst);
      for (size_t r = 0; r < want.size(); ++r)
        EXPECT_EQ(std::memcmp(got[r].data(), want[r].data(), want[r].size()), 0)
            << "trial " << trial << " buffer " << r;
    }
    EXPECT_EQ(in.free_pages(), in.capacity());
    // A room larger than the receiver's staging is refused; an unstage to a page outside the
    // pool copies nothing.
    EXPECT_THROW(in.take(in.capacity() + 1), Error);
    StagingLease room = in.take(2);
    const std::vector<PageId> outside = {PageId{1}, PageId{pages + 1}};
    const std::vector<std::vector<std::byte>> before = [&] {
      std::vector<std::vector<std::byte>> b;
      for (std::span<std::byte> x : buffers(dst)) b.emplace_back(x.begin(), x.end());
      return b;
    }();
    EXPECT_THROW(unstage(*platform, in, room.pages(), dst, outside, nullptr), Error);
    const auto after = buffers(dst);
    for (size_t r = 0; r < before.size(); ++r)
      EXPECT_EQ(std::memcmp(after[r].data(), before[r].data(), before[r].size()), 0);
  }
}

TEST(StagedTransfer, EveryExitReturnsTheStagingPages) {
  auto platform = platform::make_cpu_platform();
  kv::KvPool pool(staged_config(16, 32), platform->allocator());
  StagingPool staging(pool.config(), 4, platform->pinned_allocator());
  const std::vector<PageId> src = {PageId{3}, PageId{9}, PageId{10}, PageId{11}, PageId{2},
                                   PageId{30}, PageId{31}};
  const std::vector<PageId> dst = {PageId{1}, PageId{2}, PageId{3}, PageId{4}, PageId{5},
                                   PageId{6}, PageId{7}};
  const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(5); };
  int puts = 0;
  const PutFn ok = [&](std::span<const WriteOp> ops) {
    ++puts;
    TransferResult r{.ok = true};
    for (const WriteOp& op : ops) r.bytes += op.bytes;
    return r;
  };
  // Two chunks (4 + 3 pages) of 3 layers: 6 puts.
  StagedSend s = send_staged(*platform, pool, nullptr, staging, src, dst, ok, {}, soon());
  EXPECT_TRUE(s.transfer.ok);
  EXPECT_EQ(puts, 6);
  // Stopped before the second layer's put, a failed put, a source page outside the pool.
  puts = 0;
  s = send_staged(*platform, pool, nullptr, staging, src, dst, ok, [&] { return puts == 1; },
                  soon());
  EXPECT_TRUE(s.stopped);
  EXPECT_FALSE(s.transfer.ok);
  const PutFn broken = [](std::span<const WriteOp>) {
    return TransferResult{.ok = false, .timed_out = true, .error = "peer gone"};
  };
  s = send_staged(*platform, pool, nullptr, staging, src, dst, broken, {}, soon());
  EXPECT_FALSE(s.transfer.ok);
  EXPECT_TRUE(s.transfer.timed_out);
  EXPECT_EQ(s.transfer.error, "peer gone");
  const std::vector<PageId> bad = {PageId{33}};
  EXPECT_THROW(send_staged(*platform, pool, nullptr, staging, bad, std::span(dst).first(1), ok,
                           {}, soon()),
               Error);
  EXPECT_THROW(send_staged(*platform, pool, nullptr, staging, src, std::span(dst).first(2), ok,
                           {}, soon()),
               Error);
  EXPECT_EQ(staging.free_pages(), staging.capacity());
  // No staging page comes free before the deadline: timed out, nothing put.
  {
    StagingLease all = staging.take(staging.capacity());
    puts = 0;
    s = send_staged(*platform, pool, nullptr, staging, src, dst, ok, {},
                    std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
    EXPECT_TRUE(s.transfer.timed_out);
    EXPECT_EQ(puts, 0);
  }
  EXPECT_EQ(staging.free_pages(), staging.capacity());
}

}  // namespace
}  // namespace pagoda::disagg
