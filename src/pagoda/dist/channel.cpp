#include "pagoda/dist/channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "pagoda/core/error.h"

namespace pagoda::dist {

namespace {

/// One direction of an in-process channel.
struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<std::byte>> messages;
  bool closed = false;
};

class LocalChannel final : public ByteChannel {
 public:
  LocalChannel(std::shared_ptr<Queue> out, std::shared_ptr<Queue> in)
      : out_(std::move(out)), in_(std::move(in)) {}
  ~LocalChannel() override { close(); }
  void send(std::span<const std::byte> m) override {
    std::lock_guard<std::mutex> lock(out_->mu);
    PAGODA_REQUIRE(!out_->closed, kInternal, "the channel's peer is gone");
    out_->messages.emplace_back(m.begin(), m.end());
    out_->cv.notify_one();
  }
  bool recv(std::vector<std::byte>& out) override {
    std::unique_lock<std::mutex> lock(in_->mu);
    in_->cv.wait(lock, [&] { return !in_->messages.empty() || in_->closed; });
    if (in_->messages.empty()) return false;
    out = std::move(in_->messages.front());
    in_->messages.pop_front();
    return true;
  }
  void close() override {
    for (Queue* q : {out_.get(), in_.get()}) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->closed = true;
      q->cv.notify_all();
    }
  }

 private:
  std::shared_ptr<Queue> out_, in_;
};

class SocketChannel final : public ByteChannel {
 public:
  explicit SocketChannel(int fd) : fd_(fd) {}
  ~SocketChannel() override { close(); }
  void send(std::span<const std::byte> m) override {
    const uint64_t n = m.size();
    write_all(&n, sizeof(n));
    write_all(m.data(), m.size());
  }
  bool recv(std::vector<std::byte>& out) override {
    uint64_t n = 0;
    if (!read_all(&n, sizeof(n), /*eof_ok=*/true)) return false;
    PAGODA_REQUIRE(n <= (uint64_t{1} << 34), kInternal, "channel message of {} bytes", n);
    out.resize(static_cast<size_t>(n));
    read_all(out.data(), out.size(), /*eof_ok=*/false);
    return true;
  }
  void close() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const override { return fd_; }

 private:
  void write_all(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd_, c, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      PAGODA_REQUIRE(w > 0, kInternal, "the channel's peer is gone ({})", std::strerror(errno));
      c += w;
      n -= static_cast<size_t>(w);
    }
  }
  /// Returns false on EOF before the first byte when eof_ok.
  bool read_all(void* p, size_t n, bool eof_ok) {
    char* c = static_cast<char*>(p);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, c + got, n - got, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0 && got == 0 && eof_ok) return false;
      PAGODA_REQUIRE(r > 0, kInternal, "channel message cut short ({} of {} bytes)", got, n);
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_;
};

int high_cloexec(int fd) {
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  const int err = errno;
  ::close(fd);
  PAGODA_REQUIRE(moved >= 0, kInternal, "fcntl(F_DUPFD_CLOEXEC) failed: {}", std::strerror(err));
  return moved;
}

}  // namespace

std::pair<std::unique_ptr<ByteChannel>, std::unique_ptr<ByteChannel>> make_local_channel_pair() {
  auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
  return {std::make_unique<LocalChannel>(a, b), std::make_unique<LocalChannel>(b, a)};
}

std::unique_ptr<ByteChannel> make_socket_channel(int fd) {
  PAGODA_REQUIRE(fd >= 0, kInvalidArgument, "bad socket fd {}", fd);
  return std::make_unique<SocketChannel>(fd);
}

std::pair<int, int> make_socket_pair() {
  int fds[2];
  PAGODA_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, kInternal,
                 "socketpair failed: {}", std::strerror(errno));
  return {high_cloexec(fds[0]), high_cloexec(fds[1])};
}

}  // namespace pagoda::dist
