#pragma once
/// Platform: the hardware a process runs on (ARCHITECTURE §2). It answers device queries, owns
/// the allocator for its device, and names the default attention backend. Implementations:
/// CpuPlatform (here) and CudaPlatform (platform/cuda, built when PAGODA_CUDA is ON).
///
/// Thread safety: const methods are safe from any thread; Allocator is thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/device.h"

namespace pagoda::platform {

/// Raw memory on one device. allocate() returns memory aligned to at least `alignment` bytes or
/// throws Error(kResourceExhausted) naming the size; deallocate(nullptr) is a no-op.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes, size_t alignment = 256) = 0;
  virtual void deallocate(void* ptr) = 0;
  /// Copies bytes between this device and the host; synchronous.
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  /// Sets bytes to `value` (byte pattern); synchronous.
  virtual void fill_bytes(void* dst, uint8_t value, size_t bytes) = 0;
};

/// Deleter that returns memory to its allocator, for std::unique_ptr<T, AllocatorDeleter>.
struct AllocatorDeleter {
  Allocator* allocator = nullptr;
  void operator()(void* p) const {
    if (allocator) allocator->deallocate(p);
  }
};
using DeviceBuffer = std::unique_ptr<void, AllocatorDeleter>;

/// Allocates `bytes` on `allocator` and returns an owning buffer.
DeviceBuffer make_buffer(Allocator& allocator, size_t bytes, size_t alignment = 256);

/// What the hardware can do; filled once at start-up.
struct Capabilities {
  // CPU
  int num_cpu_threads = 1;       ///< OpenMP threads available (OMP_NUM_THREADS or cores)
  std::vector<std::string> isa;  ///< e.g. {"avx2", "fma", "avx512f"}
  // CUDA
  int sm_arch = 0;               ///< 90 for H100/H200, 80 for A100; 0 on CPU
  int sm_count = 0;
  size_t max_smem_per_block = 0; ///< opt-in shared memory per block, bytes
  size_t total_memory = 0;       ///< device memory, bytes (host RAM on CPU)
  std::string device_name;
};

enum class PlatformKind { kCpu, kCuda };

/// The platform's memory now: what a new allocation can still get (free) of the whole (total).
/// Host: MemAvailable and MemTotal of /proc/meminfo; CUDA: cudaMemGetInfo of the device.
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

/// A point in the platform's stream (cudaEvent_t on CUDA; trivially complete on the CPU).
class Event {
 public:
  virtual ~Event() = default;
  /// Marks the current end of the platform's stream (enqueued; non-blocking).
  virtual void record() = 0;
  /// Blocks the calling thread until the recorded point has been reached.
  virtual void synchronize() = 0;
  /// True when the recorded point has been reached (never blocks).
  virtual bool done() = 0;
};

/// A second queue for bulk copies that run beside the compute stream (the hierarchical KV
/// cache's backups and load-backs). Copies enqueued on one CopyStream run in order; an Event
/// from record() completes once every copy enqueued before it has finished. On CUDA this is a
/// cudaStream_t of its own with cudaEvent_t marks; on the CPU a worker thread doing memcpy, so
/// the ordering and waiting logic runs for real. Not thread-safe: one thread enqueues.
class CopyStream {
 public:
  /// One copy of a batch: `bytes` from `src` to `dst`.
  struct Op {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual ~CopyStream() = default;
  /// Enqueues a copy of `bytes` from `src` to `dst` (host or this platform's device memory;
  /// host memory should come from pinned_allocator()). Both must stay valid, and `src`
  /// unchanged, until an event recorded after this call completes. Never blocks.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Enqueues `ops` as copy() would, in one call: they run after every copy enqueued before and
  /// before every copy enqueued after, in no order among themselves (their ranges must not
  /// overlap). CUDA: one cudaMemcpyBatchAsync instead of one cudaMemcpyAsync per op (a host
  /// tier's page runs are often one page each: thousands of calls per step); default: copy()
  /// per op.
  virtual void copy_batch(std::span<const Op> ops) {
    for (const Op& op : ops) copy(op.dst, op.src, op.bytes);
  }
  /// An event that completes when every copy enqueued so far has finished.
  virtual std::unique_ptr<Event> record() = 0;
  /// Copies enqueued after this call start only once `event` (e.g. one recorded on the compute
  /// stream) has completed: cudaStreamWaitEvent on CUDA; on the CPU, whose compute stream is
  /// the calling thread, it blocks until `event` is done. Never blocks on CUDA.
  virtual void wait(Event& event) = 0;
  /// Blocks until every copy enqueued so far has finished.
  virtual void synchronize() = 0;
};

class Platform {
 public:
  virtual ~Platform() = default;
  virtual PlatformKind kind() const = 0;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  virtual Allocator& allocator() = 0;
  /// Name of the attention backend this platform uses when the user names none
  /// ("cpu" on the CPU, "cuda" on a GPU).
  virtual std::string default_attention_backend() const = 0;
  /// Blocks until all work queued on the device has finished (no-op on the CPU).
  virtual void synchronize() {}
  /// The device's memory now (MemoryInfo; the host's by default). Throws Error(kInternal) when
  /// the system cannot tell.
  virtual MemoryInfo memory_info() const;

  // ---- Streams, events and asynchronous copies (the model worker's step pipeline). ----
  /// The platform's one compute stream as an opaque handle (cudaStream_t on CUDA, nullptr on the
  /// CPU). Backends and model ops enqueue on it; it is capturable into CUDA graphs. Owned by the
  /// platform, valid while it lives.
  virtual void* native_stream() const { return nullptr; }
  /// Blocks until the platform's stream is drained (no-op on the CPU).
  virtual void synchronize_stream() {}
  /// Enqueues a host → device copy on the stream (synchronous memcpy on the CPU). For an
  /// asynchronous copy `host_src` should be pinned (pinned_allocator()) and must stay unchanged
  /// until the stream passes this point.
  virtual void copy_to_device_async(void* dst, const void* host_src, size_t bytes);
  /// Enqueues a device → host copy on the stream; `host_dst` is valid after the stream (or an
  /// event recorded after this call) completes.
  virtual void copy_to_host_async(void* host_dst, const void* src, size_t bytes);
  /// Enqueues a copy of `bytes` between two non-overlapping ranges of this platform's memory
  /// (device to device on CUDA) on the stream; std::memcpy on the CPU (the default).
  virtual void copy_async(void* dst, const void* src, size_t bytes);
  /// Enqueues setting `bytes` bytes of this platform's memory at `dst` to `value` on the stream;
  /// std::memset on the CPU (the default).
  virtual void fill_bytes_async(void* dst, uint8_t value, size_t bytes);
  /// Page-locked host memory for asynchronous copies (plain host memory on the CPU).
  virtual Allocator& pinned_allocator() { return allocator(); }
  /// A new event on this platform's stream.
  virtual std::unique_ptr<Event> make_event();
  /// A new copy stream (see CopyStream). Throws Error(kUnsupported) on a platform without one.
  virtual std::unique_ptr<CopyStream> make_copy_stream();
  /// Makes the compute stream wait for `event` (of a CopyStream of this platform) before the
  /// work enqueued after this call: cudaStreamWaitEvent on CUDA (graph-capturable, never blocks
  /// the host); on the CPU, whose compute stream is the calling thread, it blocks until done.
  virtual void wait_event(Event& event) { event.synchronize(); }
};

/// A CopyStream whose copies run on one host thread (memcpy), in order: the CPU platform's copy
/// stream. Events it records must be destroyed before it; destroying it waits for its copies.
std::unique_ptr<CopyStream> make_thread_copy_stream();

/// The CPU platform (always available).
std::unique_ptr<Platform> make_cpu_platform();

/// A process-wide table of platform factories, filled explicitly at start-up
/// (register_cuda_platform in platform/cuda adds the GPU when one is present).
class PlatformRegistry {
 public:
  using Factory = std::unique_ptr<Platform> (*)();
  /// Adds a factory; `priority` higher wins in make_default(). A factory may return nullptr when
  /// its hardware is absent.
  void add(std::string name, Factory factory, int priority);
  /// The highest-priority platform whose factory returns non-null; always at least the CPU.
  std::unique_ptr<Platform> make_default() const;
  /// The named platform or Error(kUnsupported) listing what exists.
  std::unique_ptr<Platform> make(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::string name;
    Factory factory;
    int priority;
  };
  std::vector<Entry> entries_;
};

/// A registry holding only the CPU platform; callers add others (e.g. CUDA) on top.
PlatformRegistry make_builtin_platform_registry();

}  // namespace pagoda::platform
