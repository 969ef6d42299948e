// The hierarchical KV cache's copies on the CUDA platform: a device KvPool (cudaMalloc), a
// pinned host pool (cudaHostAlloc) and the CudaPlatform copy stream. Backups and per-layer
// load-backs move exactly the bytes they should, and layer l's wait (cudaStreamWaitEvent on the
// compute stream) orders a compute-stream read after layer l's copies. Label "gpu".
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/kv/host_pool.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "pagoda/tier/controller.h"

namespace pagoda {
namespace {

kv::KvPoolConfig pool_config() {
  return kv::KvPoolConfig{.layout = kv::KvLayout::kMha, .num_layers = 4, .num_pages = 64,
                          .page_size = 16, .dtype = DType::kBF16, .num_kv_heads = 8,
                          .head_dim = 128, .head_dim_v = 128};
}

/// Reads page `page` of every layer of a device pool to the host (through the compute stream).
std::vector<std::byte> device_page(platform::CudaPlatform& p, const kv::KvPool& pool, int32_t page) {
  const size_t block = static_cast<size_t>(pool.page_size() * pool.k_row_elems()) * 2;  // bf16
  std::vector<std::byte> out(block * 2 * static_cast<size_t>(pool.num_layers()));
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const TensorView v = kv == 0 ? pool.k_view(LayerId{l}) : pool.v_view(LayerId{l});
      p.copy_to_host_async(out.data() + (static_cast<size_t>(l) * 2 + kv) * block,
                           static_cast<const char*>(v.data()) + static_cast<size_t>(page) * block,
                           block);
    }
  }
  p.synchronize_stream();
  return out;
}

TEST(CudaHiCache, BackupAndPerLayerLoadBackAreExact) {
  PAGODA_REQUIRE_GPU();
  const uint64_t seed = 4343;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  platform::CudaPlatform gpu(0);
  kv::KvPool dev(pool_config(), gpu.allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 2}, gpu.pinned_allocator());
  // Random bytes in host pages 1..40, loaded into device pages (shuffled), checked, backed up to
  // host pages 41..80 and compared byte for byte.
  const size_t page_bytes = static_cast<size_t>(kv::bytes_per_page(host.pool()));
  std::vector<std::vector<std::byte>> pages(40, std::vector<std::byte>(page_bytes));
  std::vector<int32_t> host_pages, dev_pages, back_pages;
  for (int32_t i = 0; i < 40; ++i) {
    for (auto& b : pages[static_cast<size_t>(i)]) b = static_cast<std::byte>(rng());
    kv::write_page(host.pool(), i + 1, pages[static_cast<size_t>(i)]);
    host_pages.push_back(i + 1);
    dev_pages.push_back(i + 1);
    back_pages.push_back(41 + i);
  }
  std::shuffle(dev_pages.begin(), dev_pages.end(), rng);
  tier::TierController ctl(gpu, dev, host);
  ctl.load(host_pages, dev_pages);
  ctl.begin_forward();
  for (int32_t l = 0; l < dev.num_layers(); ++l) dev.wait_layer(LayerId{l});  // compute stream waits
  ctl.end_forward();
  for (size_t i = 0; i < 40; ++i) {
    // device_page reads on the compute stream, which waited for every layer's event.
    const auto got = device_page(gpu, dev, dev_pages[i]);
    std::vector<std::byte> want(got.size());
    kv::read_page(host.pool(), host_pages[i], want);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "page " << i;
  }
  ctl.backup(dev_pages, back_pages);
  ctl.synchronize();
  std::vector<std::byte> got(page_bytes);
  for (size_t i = 0; i < 40; ++i) {
    kv::read_page(host.pool(), back_pages[i], got);
    ASSERT_EQ(got, pages[i]) << "page " << i;
  }
  EXPECT_EQ(ctl.stats().load_pages, 40);
  EXPECT_EQ(ctl.stats().backup_pages, 40);
}

}  // namespace
}  // namespace pagoda
