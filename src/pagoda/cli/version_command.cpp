#include <fmt/format.h>

#include "pagoda/cli/commands.h"
#include "pagoda/platform/platform.h"

namespace pagoda::cli {

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version and what this build can use");
  cmd->callback([] {
    auto platform = platform::make_builtin_platform_registry().make_default();
    const auto& caps = platform->capabilities();
    std::string isa;
    for (const auto& s : caps.isa) isa += (isa.empty() ? "" : " ") + s;
    fmt::print("pagoda {}\nplatform: {} ({})\nthreads: {}\nisa: {}\n", PAGODA_VERSION,
               platform->name(), caps.device_name, caps.num_cpu_threads, isa);
  });
}

}  // namespace pagoda::cli
