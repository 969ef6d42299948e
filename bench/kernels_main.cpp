// A `pagoda` binary with only the `kernels` subcommand, for bench/cpu_vs_torch.sh when the full
// CLI cannot be built.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"pagoda kernels only"};
  app.require_subcommand(1);
  pagoda::cli::add_kernels_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const pagoda::Error& e) {
    std::fprintf(stderr, "pagoda: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
