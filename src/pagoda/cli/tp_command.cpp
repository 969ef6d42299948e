// `--tp N` for generate, bench and serve, and the hidden `pagoda tp-follower` that rank r > 0
// runs.
#include <unistd.h>

#include <climits>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/tp.h"

namespace pagoda::cli {

struct TpRunner::Groups {
  std::unique_ptr<engine::LocalTpGroup> local;
  std::unique_ptr<engine::TpProcessGroup> processes;
};

TpRunner::TpRunner() = default;
TpRunner::~TpRunner() = default;
TpRunner::TpRunner(TpRunner&&) noexcept = default;
TpRunner& TpRunner::operator=(TpRunner&&) noexcept = default;

engine::WorkerFactory TpRunner::factory(platform::Platform& platform) {
  if (groups_ == nullptr) return {};
  if (groups_->local != nullptr) return groups_->local->factory();
  return groups_->processes->factory(platform);
}

TpRunner start_tp(int tp, const platform::Platform& platform, const std::string& model,
                  uint64_t weight_seed) {
  PAGODA_REQUIRE(tp >= 1 && tp <= 64, kInvalidArgument, "--tp must be in [1, 64] (got {})", tp);
  TpRunner r;
  if (tp == 1) return r;
  r.groups_ = std::make_unique<TpRunner::Groups>();
  if (platform.kind() == platform::PlatformKind::kCpu) {
    r.groups_->local = std::make_unique<engine::LocalTpGroup>(tp);
  } else {
    char exe[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    PAGODA_REQUIRE(n > 0, kInternal, "cannot find this executable to start the other ranks");
    exe[n] = '\0';
    r.groups_->processes =
        std::make_unique<engine::TpProcessGroup>(tp, exe, model, weight_seed);
  }
  return r;
}

void add_tp_option(CLI::App* cmd, int& tp) {
  cmd->add_option("--tp", tp,
                  "tensor parallelism: ranks (GPUs on CUDA, one process each; threads on the "
                  "CPU)")
      ->capture_default_str();
}

void add_tp_follower_command(CLI::App& app) {
  struct Options {
    int fd = -1, rank = 0, tp = 0;
    std::string model;
    uint64_t weight_seed = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tp-follower", "internal: a tensor-parallel rank > 0 (started by --tp; not for users)");
  cmd->group("");  // hidden from --help
  cmd->add_option("--fd", o->fd)->required();
  cmd->add_option("--rank", o->rank)->required();
  cmd->add_option("--tp", o->tp)->required();
  cmd->add_option("--model", o->model)->required();
  cmd->add_option("--weight-seed", o->weight_seed);
  cmd->callback([o] {
    const int rc = engine::tp_follower_main(o->fd, o->rank, o->tp, o->model, o->weight_seed);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace pagoda::cli
