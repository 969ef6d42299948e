#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/log.h"
#include "pagoda/tier/page_record.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {
namespace {

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

class FileStorage final : public StorageBackend {
 public:
  explicit FileStorage(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    PAGODA_REQUIRE(!ec && std::filesystem::is_directory(dir_), kInvalidArgument,
                   "hicache storage directory '{}' cannot be created: {}", dir_, ec.message());
    PAGODA_REQUIRE(::access(dir_.c_str(), W_OK | X_OK) == 0, kInvalidArgument,
                   "hicache storage directory '{}' is not writable", dir_);
  }

  std::string describe() const override { return "file:" + dir_; }

  int64_t batch_exists(std::span<const PageKey> keys) override {
    int64_t n = 0;
    for (const PageKey& k : keys) {
      if (::access(path(k).c_str(), F_OK) != 0) break;
      ++n;
    }
    return n;
  }

  bool get(const PageKey& key, std::span<std::byte> out) override {
    const std::string file = path(key);
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ++stats_.get_misses;
      return false;
    }
    PageHeader h;
    struct stat st {};
    const bool read_ok = ::fstat(fd, &st) == 0 &&
                         static_cast<uint64_t>(st.st_size) == sizeof(PageHeader) + out.size() &&
                         read_all(fd, &h, sizeof h) && read_all(fd, out.data(), out.size());
    ::close(fd);
    if (!read_ok || !page_header_matches(h, key, out)) {
      ++stats_.corrupt_pages;
      PAGODA_LOG_WARN("hicache storage: page {} in {} is corrupt (size, key or checksum); "
                      "it is removed and recomputed",
                      key.hex(), dir_);
      ::unlink(file.c_str());  // a later put stores a good copy again
      return false;
    }
    ++stats_.get_hits;
    stats_.bytes_read += static_cast<int64_t>(out.size());
    return true;
  }

  bool put(const PageKey& key, std::span<const std::byte> data) override {
    const std::string file = path(key);
    if (::access(file.c_str(), F_OK) == 0) {
      ++stats_.put_skipped;
      return true;
    }
    static std::atomic<uint64_t> counter{0};
    const std::string tmp =
        fmt::format("{}/.{}.{}.{}.tmp", dir_, key.hex(), ::getpid(), counter.fetch_add(1));
    const PageHeader h = make_page_header(key, data);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write_all(fd, &h, sizeof h) && write_all(fd, data.data(), data.size()) &&
              ::fsync(fd) == 0;
    if (fd >= 0) ok = (::close(fd) == 0) && ok;
    ok = ok && ::rename(tmp.c_str(), file.c_str()) == 0;
    if (ok) {
      const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        ::fsync(dfd);  // the rename itself reaches the disk
        ::close(dfd);
      }
    }
    if (!ok) {
      const int err = errno;
      ::unlink(tmp.c_str());
      ++stats_.put_errors;
      PAGODA_LOG_WARN("hicache storage: writing page {} to {} failed: {}", key.hex(), dir_,
                      std::strerror(err));
      return false;
    }
    ++stats_.puts;
    stats_.bytes_written += static_cast<int64_t>(sizeof h + data.size());
    return true;
  }

  const StorageStats& stats() const override { return stats_; }

 private:
  std::string path(const PageKey& k) const { return dir_ + "/" + k.hex() + ".kvpage"; }

  std::string dir_;
  StorageStats stats_;
};

}  // namespace

std::unique_ptr<StorageBackend> make_file_storage(const std::string& dir) {
  return std::make_unique<FileStorage>(dir);
}

}  // namespace pagoda::tier
