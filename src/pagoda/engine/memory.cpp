#include "pagoda/engine/memory.h"

#include "pagoda/cache/swa_radix_cache.h"

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::engine {

int64_t unowned_page_references(const kv::PageRefs& refs, int64_t owned_refs) {
  int64_t references = 0;
  for (int32_t p = 1; p <= refs.num_pages(); ++p) references += refs.refcount(PageId{p});
  return references - owned_refs;
}

EngineMemory::EngineMemory(int32_t num_pages, int32_t page_size, int32_t max_reqs,
                           int32_t max_context_len)
    : allocator_(std::make_unique<kv::PageAllocator>(num_pages, page_size)),
      table_(std::make_unique<kv::ReqToTokenTable>(max_reqs, max_context_len)) {}

EngineMemory::~EngineMemory() { reset_cache(); }

void EngineMemory::enable_swa(int32_t swa_pages) {
  PAGODA_CHECK(cache_ == nullptr && swa_ == nullptr);
  swa_ = std::make_unique<kv::PageAllocator>(swa_pages, allocator_->page_size());
  swa_pages_ = std::make_unique<kv::SwaPages>(*allocator_, *swa_);
  swa_refs_ = std::make_unique<kv::SwaPageRefs>(*swa_pages_);
}

int64_t EngineMemory::leaked_swa_pages() const {
  if (swa_ == nullptr) return 0;
  const auto* tree = dynamic_cast<const cache::SwaRadixCache*>(cache_.get());
  const int64_t tree_pages = tree != nullptr ? tree->swa_tree_pages() : 0;
  return unowned_page_references(*swa_, tree_pages + owners_.request_private_swa_pages());
}

void EngineMemory::set_cache(std::unique_ptr<cache::PrefixCache> cache, tier::HiCache* hicache,
                             Owners owners) {
  PAGODA_CHECK(cache != nullptr && owners.live_requests && owners.request_private_pages &&
               owners.live_rows);
  cache_ = std::move(cache);
  hicache_ = hicache;
  owners_ = std::move(owners);
}

void EngineMemory::reset_cache() {
  hicache_ = nullptr;
  cache_.reset();
}

int64_t EngineMemory::leaked_pages() const {
  const int64_t tree_pages = cache_->total_size() / allocator_->page_size();
  return unowned_page_references(*allocator_, tree_pages + owners_.request_private_pages());
}

int64_t EngineMemory::drain_prefix_cache() {
  PAGODA_REQUIRE(owners_.live_requests() == 0, kFailedPrecondition,
                 "drain_prefix_cache: {} requests are still waiting or running",
                 owners_.live_requests());
  return cache_->evict(cache_->evictable_size());
}

int64_t EngineMemory::drain_host_cache() {
  PAGODA_REQUIRE(owners_.live_requests() == 0, kFailedPrecondition,
                 "drain_host_cache: {} requests are still waiting or running",
                 owners_.live_requests());
  return hicache_ != nullptr ? hicache_->drain_host() : 0;
}

int64_t EngineMemory::leaked_host_pages() const {
  if (hicache_ == nullptr) return 0;
  const kv::PageAllocator& host = hicache_->host_pool().pages();
  return unowned_page_references(host, hicache_->host().num_entries());
}

int64_t EngineMemory::referenced_pages() const {
  int64_t n = 0;
  for (int32_t p = 1; p <= allocator_->num_pages(); ++p) n += allocator_->refcount(PageId{p}) != 0;
  return n;
}

bool EngineMemory::idle_pages_accounted() const {
  if (owners_.live_requests() != 0) return true;
  const int64_t tree_pages = cache_->total_size() / allocator_->page_size();
  return allocator_->num_free_pages() + tree_pages == allocator_->num_pages();
}

int64_t EngineMemory::leaked_rows() const {
  return (table_->max_reqs() - table_->num_free_rows()) - owners_.live_rows();
}

std::vector<int32_t> EngineMemory::leaked_states() const {
  if (owners_.states == nullptr) return {};
  return owners_.states->leaked(owners_.state_holders());
}

void EngineMemory::check_integrity() const {
  allocator_->check_integrity();
  table_->check_integrity();
  cache_->check_integrity();
  PAGODA_CHECK_EQ(leaked_pages(), 0);
  if (swa_pages_ != nullptr) {
    swa_pages_->check_integrity();
    swa_pages_->check_holders_share();
    PAGODA_CHECK_EQ(leaked_swa_pages(), 0);
  }
  PAGODA_CHECK_EQ(leaked_host_pages(), 0);
  PAGODA_CHECK_EQ(leaked_rows(), 0);
  PAGODA_CHECK(idle_pages_accounted());
  if (owners_.states != nullptr) {
    owners_.states->check_integrity();
    PAGODA_CHECK(leaked_states().empty(), "a state slot is held by no active request or snapshot");
  }
}

}  // namespace pagoda::engine
