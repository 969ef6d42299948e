#pragma once
/// HttpServer: cpp-httplib's Server plus the two things `pagoda serve` needs that Debian's
/// cpp-httplib 0.11 does not offer: a configurable listen backlog (0.11 listens with a fixed 5,
/// so bursts of new connections overflow the queue and wait for the client's 1 s SYN retry) and
/// a way for a handler to see that its client has gone (a non-streamed request is then aborted
/// instead of running to max_tokens).
///
/// It replaces httplib's per-connection loop (Server::process_and_close_socket, a virtual made
/// for this) with an equivalent one: keep-alive up to keep_alive_max_count requests, each waiting
/// at most keep_alive_timeout for its first byte (one poll, where 0.11 polls every 10 ms), one
/// buffered stream per connection (pipelined bytes are kept between requests), then shutdown and
/// close. Requests are still parsed, routed and answered by httplib (Server::process_request).
/// While a handler runs, the connection's socket is recorded for its thread (client_gone).
/// Thread safe as httplib::Server is. Contract: docs/design/server.md.

#include <httplib.h>

#include <string>

namespace pagoda::server {

class HttpServer : public httplib::Server {
 public:
  /// Sets the listen queue length of the bound socket; call after bind_to_port /
  /// bind_to_any_port (Linux applies listen() on a listening socket as a new backlog; the kernel
  /// caps it at net.core.somaxconn). False when not bound or listen() fails.
  bool set_listen_backlog(int backlog);

  /// On the thread of a running handler (or content provider): true once the client of the
  /// current request has closed or reset its connection. False on any other thread.
  static bool client_gone();

 private:
  bool process_and_close_socket(socket_t sock) override;
};

/// Binds `svr` to host:port (port 0: any free port) and returns the bound port. Throws
/// Error(kInvalidArgument) naming the address when it cannot bind. `pagoda serve` and
/// `pagoda router` both listen through it.
int bind_listener(httplib::Server& svr, const std::string& host, int port);

}  // namespace pagoda::server
