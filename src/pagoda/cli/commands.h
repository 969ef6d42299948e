#pragma once
/// Subcommands of the `pagoda` CLI. Each lives in its own <name>_command.cpp and registers itself
/// on the root app; main.cpp calls every add_*_command in the order they appear in --help.
/// A subcommand reports bad input as pagoda::Error; main prints it and exits with status 2.

#include <CLI/CLI.hpp>

namespace pagoda::cli {

/// `pagoda version`: prints the version and the build's capabilities.
void add_version_command(CLI::App& app);

}  // namespace pagoda::cli
