// TpProcessGroup and tp_follower_main: one process per GPU over NCCL (see tp.h).
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "pagoda/core/error.h"
#include "pagoda/dist/nccl_communicator.h"
#include "pagoda/dist/wire.h"
#include "pagoda/engine/tp.h"
#include "pagoda/model/safetensors.h"
#ifdef PAGODA_HAVE_CUDA_BACKEND
#include "pagoda/platform/cuda/cuda_platform.h"
#endif

extern char** environ;

namespace pagoda::engine {

namespace {

/// The follower's settings (everything but the model, which argv names).
struct Settings {
  DType dtype = DType::kBF16;
  model::WorkerConfig worker;
  int32_t table_rows = 0, table_cols = 0;
  std::vector<std::byte> nccl_id;
};

void encode_settings(const Settings& s, dist::WireWriter& w) {
  w.put(s.dtype);
  const model::WorkerConfig& c = s.worker;
  w.put(c.page_size);
  w.put(c.num_pages);
  w.put(c.kv_dtype);
  w.put_str(c.backend.attention);
  w.put_str(c.backend.prefill);
  w.put_str(c.backend.decode);
  w.put_str(c.backend.linear);
  w.put(c.backend.verify);
  w.put(c.backend.kernels);  // plain values; every rank runs the same binary
  w.put<uint8_t>(c.mixed_batches);
  w.put<uint8_t>(c.cuda_graph);
  w.put(c.max_batch_size);
  w.put(s.table_rows);
  w.put(s.table_cols);
  w.put_vec(s.nccl_id);
}

Settings decode_settings(dist::WireReader& r) {
  Settings s;
  s.dtype = r.get<DType>();
  model::WorkerConfig& c = s.worker;
  c.page_size = r.get<int32_t>();
  c.num_pages = r.get<int32_t>();
  c.kv_dtype = r.get<DType>();
  c.backend.attention = r.get_str();
  c.backend.prefill = r.get_str();
  c.backend.decode = r.get_str();
  c.backend.linear = r.get_str();
  c.backend.verify = r.get<backends::VerifyRoute>();
  c.backend.kernels = r.get<backends::KernelOptions>();
  c.mixed_batches = r.get<uint8_t>() != 0;
  c.cuda_graph = r.get<uint8_t>() != 0;
  c.max_batch_size = r.get<int32_t>();
  s.table_rows = r.get<int32_t>();
  s.table_cols = r.get<int32_t>();
  r.get_vec(s.nccl_id);
  return s;
}

std::string exit_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return "unknown status";
}

}  // namespace

struct TpProcessGroup::Impl {
  int tp = 1;
  std::vector<pid_t> pids;        // ranks 1..N-1
  std::vector<std::unique_ptr<dist::ByteChannel>> channels;
  std::unique_ptr<dist::Communicator> comm;
  std::mutex comm_mu;
  std::thread watchdog;
  std::atomic<bool> stopping{false};
  bool used = false;

  /// Watches the followers' sockets: a follower that exits with an error or a signal (its
  /// socket hangs up) ends this process after killing the others: the group cannot go on, and
  /// rank 0 could otherwise wait forever inside a collective.
  void watch() {
    std::vector<bool> done(pids.size(), false);
    while (!stopping.load()) {
      std::vector<pollfd> fds;
      std::vector<size_t> who;
      for (size_t i = 0; i < channels.size(); ++i) {
        if (done[i]) continue;
        fds.push_back(pollfd{.fd = channels[i]->fd(), .events = POLLIN, .revents = 0});
        who.push_back(i);
      }
      if (fds.empty()) return;
      if (::poll(fds.data(), fds.size(), 200) <= 0) continue;
      for (size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const size_t i = who[k];
        int status = 0;
        pid_t got = 0;
        for (int waited = 0; waited < 50 && got == 0; ++waited) {  // up to 5 s to exit
          got = ::waitpid(pids[i], &status, WNOHANG);
          if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        done[i] = true;
        // A follower exits 0 only after the leader's stop message (or its closed socket); one
        // that closed its socket while the group is being stopped may still be tearing down its
        // GPU context (the destructor reaps it).
        if (got == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          pids[i] = -1;
          continue;
        }
        if (got == 0 && stopping.load()) continue;
        if (got == pids[i]) pids[i] = -1;
        std::fprintf(stderr,
                     "pagoda: tensor-parallel rank %zu (pid %d) failed (%s); stopping every "
                     "rank\n",
                     i + 1, static_cast<int>(got > 0 ? got : pids[i]),
                     got > 0 ? exit_status(status).c_str() : "its connection closed");
        {
          std::lock_guard<std::mutex> lock(comm_mu);
          if (comm != nullptr) comm->abort();
        }
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGKILL);
        std::fflush(nullptr);
        ::_exit(70);
      }
    }
  }
};

TpProcessGroup::TpProcessGroup(int tp, const std::string& exe, const std::string& model_spec,
                               uint64_t weight_seed)
    : impl_(std::make_unique<Impl>()) {
  PAGODA_REQUIRE(tp >= 2, kInvalidArgument, "a process group needs tp >= 2 (got {})", tp);
  PAGODA_REQUIRE(dist::nccl_available(), kUnsupported,
                 "tensor parallelism is unavailable: this build has no NCCL");
#ifdef PAGODA_HAVE_CUDA_BACKEND
  const int gpus = platform::cuda_device_count();
#else
  const int gpus = 0;
#endif
  PAGODA_REQUIRE(gpus >= tp, kUnsupported, "--tp {} needs {} GPUs; this machine has {}", tp, tp,
                 gpus);
  impl_->tp = tp;
  for (int r = 1; r < tp; ++r) {
    auto [mine, theirs] = dist::make_socket_pair();
    impl_->channels.push_back(dist::make_socket_channel(mine));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, theirs, 3);
    const std::string rank = std::to_string(r), size = std::to_string(tp),
                      seed = std::to_string(weight_seed);
    std::vector<std::string> args = {exe,    "tp-follower", "--fd",    "3",
                                     "--rank", rank,        "--tp",    size,
                                     "--model", model_spec,  "--weight-seed", seed};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(theirs);
    PAGODA_REQUIRE(rc == 0, kInternal, "could not start tensor-parallel rank {} ({}): {}", r, exe,
                   std::strerror(rc));
    impl_->pids.push_back(pid);
  }
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
}

TpProcessGroup::~TpProcessGroup() {
  impl_->stopping.store(true);
  {  // rank 0's communicator goes first: the followers tear theirs down without waiting for it
    std::lock_guard<std::mutex> lock(impl_->comm_mu);
    impl_->comm.reset();
  }
  // The leader worker (destroyed with the engine) sent the stop message; closing the sockets
  // ends followers that never got one.
  for (auto& c : impl_->channels) c->close();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  for (pid_t p : impl_->pids) {
    if (p <= 0) continue;
    int status = 0;
    pid_t got = 0;
    for (int waited = 0; waited < 300 && got == 0; ++waited) {  // 30 s
      got = ::waitpid(p, &status, WNOHANG);
      if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (got == 0) {
      ::kill(p, SIGKILL);
      (void)::waitpid(p, &status, 0);
    }
  }
}

WorkerFactory TpProcessGroup::factory(platform::Platform& platform) {
  Impl* impl = impl_.get();
  return [impl, &platform](const model::LlamaModel& model, DType dtype,
                           const model::WorkerConfig& config,
                           kv::ReqToTokenTable& table) -> BuiltWorker {
    PAGODA_REQUIRE(!impl->used, kFailedPrecondition, "a TpProcessGroup serves one engine");
    impl->used = true;
    (void)model::Decoder::shard_of(model.config(), 0, impl->tp);
    Settings s{.dtype = dtype,
               .worker = config,
               .table_rows = table.max_reqs(),
               .table_cols = table.max_context_len(),
               .nccl_id = dist::nccl_unique_id()};
    s.worker.comm = nullptr;
    std::vector<std::byte> msg;
    dist::WireWriter w(msg);
    encode_settings(s, w);
    for (auto& c : impl->channels) c->send(msg);
    {
      auto comm = dist::make_nccl_communicator(s.nccl_id, 0, impl->tp, platform.native_stream());
      std::lock_guard<std::mutex> lock(impl->comm_mu);
      impl->comm = std::move(comm);
    }
    model::WorkerConfig c = config;
    c.comm = impl->comm.get();
    auto local =
        std::make_unique<model::LlamaWorker>(model, make_model_ops(platform, dtype, c.cpu_gemm),
                                             c, table);
    std::vector<dist::ByteChannel*> ends;
    for (auto& e : impl->channels) ends.push_back(e.get());
    return TpLeaderWorker::make(std::move(local), std::move(ends), table);
  };
}

int tp_follower_main(int fd, int rank, int tp, const std::string& model_spec,
                     uint64_t weight_seed) {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // rank 0 gone: this rank goes too
  if (::getppid() != parent) return 1;
  try {
    std::unique_ptr<dist::ByteChannel> channel = dist::make_socket_channel(fd);
    // Load the model while rank 0 loads its own; then wait for the settings.
    std::unique_ptr<model::LlamaModel> llama;
    {
      model::LoadedModel loaded = model::load_model(model_spec, weight_seed);
      llama = std::make_unique<model::LlamaModel>(loaded.config, std::move(loaded.weights));
    }
    std::vector<std::byte> msg;
    if (!channel->recv(msg)) return 0;  // rank 0 stopped before building its engine
    dist::WireReader r(msg);
    Settings s = decode_settings(r);
#ifdef PAGODA_HAVE_CUDA_BACKEND
    platform::CudaPlatform gpu(rank);
#else
    std::unique_ptr<platform::Platform> cpu = platform::make_cpu_platform();
    platform::Platform& gpu = *cpu;
    PAGODA_REQUIRE(false, kUnsupported, "this build has no CUDA platform");
#endif
    std::unique_ptr<dist::Communicator> comm =
        dist::make_nccl_communicator(s.nccl_id, rank, tp, gpu.native_stream());
    kv::ReqToTokenTable table(s.table_rows, s.table_cols);
    s.worker.comm = comm.get();
    model::LlamaWorker worker(*llama, make_model_ops(gpu, s.dtype), s.worker, table);
    run_tp_follower(worker, table, *channel, gpu);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagoda: tensor-parallel rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace pagoda::engine
