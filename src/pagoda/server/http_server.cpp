// HttpServer: the per-connection loop of `pagoda serve` (see http_server.h).
#include "pagoda/server/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "pagoda/core/error.h"

namespace pagoda::server {

namespace {

/// The socket of the connection whose request this thread is handling (-1: none).
thread_local socket_t t_connection = INVALID_SOCKET;

/// poll() for `events` up to `timeout_ms`, retried on EINTR; the poll result.
int poll_one(socket_t sock, short events, int timeout_ms, short* revents = nullptr) {
  pollfd p{sock, events, 0};
  int n = 0;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (revents) *revents = p.revents;
  return n;
}

int timeout_ms(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

/// True when the peer of `sock` closed or reset the connection (httplib's is_socket_alive, with
/// POLLRDHUP): readable with nothing to read, or an error.
bool peer_closed(socket_t sock) {
  short revents = 0;
  const int n = poll_one(sock, POLLIN | POLLRDHUP, 0, &revents);
  if (n < 0) return true;
  if (n == 0) return false;
  if (revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  char c = 0;
  const ssize_t r = ::recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void ip_and_port(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  std::array<char, NI_MAXHOST> host{};
  std::array<char, NI_MAXSERV> serv{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(), host.size(),
                    serv.data(), serv.size(), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return;
  ip = host.data();
  port = std::atoi(serv.data());
}

/// httplib::Stream over one connection's socket, buffered for httplib's byte-wise line reader;
/// lives as long as the connection, so bytes of a pipelined next request stay buffered.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, int read_timeout_ms, int write_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  bool buffered() const { return off_ < size_; }

  bool is_readable() const override {
    return buffered() || poll_one(sock_, POLLIN, read_timeout_ms_) > 0;
  }
  bool is_writable() const override {
    return poll_one(sock_, POLLOUT, write_timeout_ms_) > 0 && !peer_closed(sock_);
  }
  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      if (!is_readable()) return -1;
      ssize_t n = 0;
      do {
        n = ::recv(sock_, buf_.data(), buf_.size(), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      size_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, size_ - off_);
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n = 0;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip_and_port(addr, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip_and_port(addr, len, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  socket_t sock_;
  int read_timeout_ms_, write_timeout_ms_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, size_ = 0;
};

}  // namespace

bool HttpServer::set_listen_backlog(int backlog) {
  const socket_t sock = svr_sock_;
  return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
}

bool HttpServer::client_gone() {
  return t_connection != INVALID_SOCKET && peer_closed(t_connection);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, timeout_ms(read_timeout_sec_, read_timeout_usec_),
                        timeout_ms(write_timeout_sec_, write_timeout_usec_));
  const int keep_alive_ms = timeout_ms(keep_alive_timeout_sec_, 0);
  t_connection = sock;
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (!strm.buffered() && poll_one(sock, POLLIN, keep_alive_ms) <= 0) break;
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (!ok || closed) break;
  }
  t_connection = INVALID_SOCKET;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

int bind_listener(httplib::Server& svr, const std::string& host, int port) {
  if (port == 0) {
    port = svr.bind_to_any_port(host);
    PAGODA_REQUIRE(port > 0, kInvalidArgument, "cannot bind {} (any port)", host);
  } else {
    PAGODA_REQUIRE(svr.bind_to_port(host, port), kInvalidArgument, "cannot bind {}:{}", host,
                   port);
  }
  return port;
}

}  // namespace pagoda::server
