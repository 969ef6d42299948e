#include <omp.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <new>

#include "pagoda/core/error.h"
#include "pagoda/core/host_memory.h"
#include "pagoda/platform/platform.h"

namespace pagoda::platform {
namespace {

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }
  /// Large buffers in transparent huge pages (core/host_memory.h).
  void* allocate(size_t bytes, size_t alignment) override {
    return allocate_host(bytes, alignment);
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes) std::memset(dst, value, bytes);
  }
};

class CpuPlatform final : public Platform {
 public:
  CpuPlatform() {
    caps_.num_cpu_threads = omp_get_max_threads();
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) caps_.isa.push_back("sse4.2");
    if (__builtin_cpu_supports("avx2")) caps_.isa.push_back("avx2");
    if (__builtin_cpu_supports("fma")) caps_.isa.push_back("fma");
    if (__builtin_cpu_supports("avx512f")) caps_.isa.push_back("avx512f");
    if (__builtin_cpu_supports("avx512bw")) caps_.isa.push_back("avx512bw");
    struct sysinfo info {};
    if (sysinfo(&info) == 0) caps_.total_memory = static_cast<size_t>(info.totalram) * info.mem_unit;
    caps_.device_name = "host CPU";
  }
  PlatformKind kind() const override { return PlatformKind::kCpu; }
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  const Capabilities& capabilities() const override { return caps_; }
  Allocator& allocator() override { return allocator_; }
  std::string default_attention_backend() const override { return "cpu"; }
  std::unique_ptr<CopyStream> make_copy_stream() override { return make_thread_copy_stream(); }

 private:
  Capabilities caps_;
  HostAllocator allocator_;
};

}  // namespace

DeviceBuffer make_buffer(Allocator& allocator, size_t bytes, size_t alignment) {
  return DeviceBuffer(allocator.allocate(bytes, alignment), AllocatorDeleter{&allocator});
}

std::unique_ptr<Platform> make_cpu_platform() { return std::make_unique<CpuPlatform>(); }

namespace {
/// The CPU has no queue: every recorded point is already reached.
class HostEvent final : public Event {
 public:
  void record() override {}
  void synchronize() override {}
  bool done() override { return true; }
};
}  // namespace

void Platform::copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
  allocator().copy_to_device(dst, host_src, bytes);
}

void Platform::copy_to_host_async(void* host_dst, const void* src, size_t bytes) {
  allocator().copy_to_host(host_dst, src, bytes);
}

void Platform::copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Platform::fill_bytes_async(void* dst, uint8_t value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
}

std::unique_ptr<Event> Platform::make_event() { return std::make_unique<HostEvent>(); }

MemoryInfo Platform::memory_info() const {
  // MemAvailable (what the kernel can hand out without swapping: free plus reclaimable cache),
  // not sysinfo's freeram, which leaves the page cache out.
  std::ifstream in("/proc/meminfo");
  MemoryInfo m;
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total_bytes = kib * 1024;
    if (key == "MemAvailable:") m.free_bytes = kib * 1024;
  }
  PAGODA_REQUIRE(m.total_bytes > 0 && m.free_bytes > 0, kInternal,
                 "/proc/meminfo gave no MemTotal / MemAvailable: the host's free memory is unknown");
  return m;
}

std::unique_ptr<CopyStream> Platform::make_copy_stream() {
  throw_error(ErrorCode::kUnsupported, "platform '{}' has no copy stream (hierarchical KV cache)",
              name());
}

void PlatformRegistry::add(std::string name, Factory factory, int priority) {
  for (const auto& e : entries_) {
    PAGODA_REQUIRE(e.name != name, kInvalidArgument, "platform '{}' registered twice", name);
  }
  entries_.push_back({std::move(name), factory, priority});
}

std::unique_ptr<Platform> PlatformRegistry::make_default() const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const Entry* a, const Entry* b) { return a->priority > b->priority; });
  for (const Entry* e : order) {
    if (auto p = e->factory()) return p;
  }
  return make_cpu_platform();
}

std::unique_ptr<Platform> PlatformRegistry::make(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name != name) continue;
    auto p = e.factory();
    PAGODA_REQUIRE(p != nullptr, kUnsupported, "platform '{}' is not available on this machine",
                   name);
    return p;
  }
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw_error(ErrorCode::kUnsupported, "unknown platform '{}' (known: {})", name, known);
}

std::vector<std::string> PlatformRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

PlatformRegistry make_builtin_platform_registry() {
  PlatformRegistry r;
  r.add("cpu", &make_cpu_platform, 0);
  return r;
}

}  // namespace pagoda::platform
