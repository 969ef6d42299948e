#pragma once
/// The repeatable `--kernel-option NAME=VALUE` flag of `pagoda bench`, `generate`, `serve` and
/// `conformance` (backends/kernel_options.h: names, values, defaults).

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/backends/kernel_options.h"

namespace pagoda::cli {

/// Registers the flag on `cmd`; each value is applied to `options` (set_kernel_option) while the
/// command line is parsed, so an unknown name or a bad value fails it with an error naming it.
/// `options` must outlive the parse.
void add_kernel_option_flag(CLI::App* cmd, backends::KernelOptions& options);

/// Every option of `options` as a JSON object {name: value} (booleans and integers), for the
/// --json reports ("kernel_options").
nlohmann::json kernel_options_json(const backends::KernelOptions& options);

}  // namespace pagoda::cli
