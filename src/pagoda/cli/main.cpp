// The `pagoda` CLI: dispatches to subcommands (commands.h); exits 2 with a clear message on bad
// input and 1 when a command reports failure.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"pagoda: paged KV cache, radix prefix cache and attention backends for LLM serving"};
  app.require_subcommand(1);
  pagoda::cli::add_version_command(app);
  pagoda::cli::add_conformance_command(app);
  pagoda::cli::add_kernels_command(app);
  pagoda::cli::add_replay_command(app);
  pagoda::cli::add_generate_command(app);
  pagoda::cli::add_bench_command(app);
  pagoda::cli::add_tokenize_command(app);
  pagoda::cli::add_tp_follower_command(app);
  pagoda::cli::add_serve_command(app);
  pagoda::cli::add_router_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const pagoda::Error& e) {
    std::fprintf(stderr, "pagoda: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagoda: fatal: %s\n", e.what());
    return 1;
  }
  return 0;
}
