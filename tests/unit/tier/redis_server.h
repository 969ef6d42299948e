#pragma once
// A throwaway Redis (or Valkey) server for tests: started on a free loopback port in a fresh
// directory, nothing persisted, killed by the destructor or by kill() (a server dying mid-run).
// available() is false when neither redis-server nor valkey-server is installed
// (scripts/setup.sh installs redis-server).

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace pagoda::testing {

class RedisServer {
 public:
  /// Starts the server with `extra` arguments (e.g. {"--maxmemory", "2mb"}).
  explicit RedisServer(std::vector<std::string> extra = {}) {
    const std::string bin = find_binary();
    if (bin.empty()) return;
    port_ = free_port();
    dir_ = std::filesystem::temp_directory_path() /
           ("pagoda_redis_" + std::to_string(::getpid()) + "_" + std::to_string(port_));
    std::filesystem::create_directories(dir_);
    std::vector<std::string> args = {bin,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_.string(),
                                     "--loglevel",
                                     "warning",
                                     "--logfile",
                                     (dir_ / "redis.log").string(),
                                     "--protected-mode",
                                     "no"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;  // built before fork: the child only calls async-signal-safe code
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    // Ready once it accepts connections and answers PING.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline && !(ready_ = ping()))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~RedisServer() {
    kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// The server is installed, started and answered PING.
  bool available() const { return ready_; }
  int port() const { return port_; }
  /// "redis://127.0.0.1:PORT/prefix".
  std::string url(const std::string& prefix) const {
    return "redis://127.0.0.1:" + std::to_string(port_) + "/" + prefix;
  }
  /// Sends one inline command and returns the first line of the answer ("" when unreachable).
  std::string command(const std::string& line) const {
    const int fd = connect_fd();
    if (fd < 0) return "";
    const std::string msg = line + "\r\n";
    std::string out;
    if (::write(fd, msg.data(), msg.size()) == static_cast<ssize_t>(msg.size())) {
      char c = 0;
      while (::read(fd, &c, 1) == 1 && c != '\n') out += c;
    }
    ::close(fd);
    if (!out.empty() && out.back() == '\r') out.pop_back();
    return out;
  }
  bool ping() const { return command("PING") == "+PONG"; }
  /// SIGKILL (no shutdown work), then reaps it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  static std::string find_binary() {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
    dirs += ":/usr/bin:/usr/sbin";
    for (const char* name : {"redis-server", "valkey-server"}) {
      size_t at = 0;
      while (at <= dirs.size()) {
        const size_t end = std::min(dirs.find(':', at), dirs.size());
        const std::filesystem::path p = std::filesystem::path(dirs.substr(at, end - at)) / name;
        if (::access(p.c_str(), X_OK) == 0) return p.string();
        at = end + 1;
      }
    }
    return "";
  }
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  int connect_fd() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  pid_t pid_ = -1;
  bool ready_ = false;
  int port_ = 0;
  std::filesystem::path dir_;
};

}  // namespace pagoda::testing
