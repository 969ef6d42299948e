#pragma once
/// ByteChannel: an ordered, reliable stream of messages from one rank to another (the leader
/// sends each step's WorkerBatch to every follower over one). Two transports: an in-process
/// queue (threads; tests) and a connected Unix-domain socket (one process per GPU).
///
/// Thread rules: one thread sends and one thread receives on a channel end; close() from any
/// thread.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace pagoda::dist {

class ByteChannel {
 public:
  virtual ~ByteChannel() = default;
  /// Sends one message. Throws Error(kInternal) when the peer is gone (closed or died).
  virtual void send(std::span<const std::byte> message) = 0;
  /// Receives the next message into `out`. Returns false when the peer closed the channel (or
  /// died) before a new message began; throws Error(kInternal) on a message cut short.
  virtual bool recv(std::vector<std::byte>& out) = 0;
  /// Closes this end: the peer's recv returns false once it has drained what was sent.
  virtual void close() = 0;
  /// The socket's file descriptor (to poll for a dead peer), or -1 for an in-process channel.
  virtual int fd() const { return -1; }
};

/// Two connected in-process ends (first sends to second and vice versa).
std::pair<std::unique_ptr<ByteChannel>, std::unique_ptr<ByteChannel>> make_local_channel_pair();

/// The channel over a connected stream socket `fd` (taken over: closed with the channel).
std::unique_ptr<ByteChannel> make_socket_channel(int fd);

/// A connected pair of Unix-domain stream sockets, both close-on-exec and numbered >= 10 (so a
/// spawned child can have one dup2'ed to a low number). Throws Error(kInternal).
std::pair<int, int> make_socket_pair();

}  // namespace pagoda::dist
