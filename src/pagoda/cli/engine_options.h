#pragma once
/// The engine flags of `pagoda serve`, `bench` and `generate`, one block (engine/engine_args.h
/// is the struct they fill and its one conversion to an EngineConfig): --backend,
/// --prefill-backend, --decode-backend, --linear-backend, --kernel-option, --page-size,
/// --pool-tokens (or --kv-cache-memory / --mem-fraction-static, --swa-full-tokens-ratio),
/// --max-running, --chunk-size, --max-prefill-tokens, --policy, --dtype, --kv-dtype, --cpu-gemm,
/// --cuda-graph, --overlap, --no-radix, --no-mixed, --max-context-len and the --hicache-* block
/// (hicache_options.h). Also the --host / --port / --threads block of serve and router.

#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/cli/hicache_options.h"
#include "pagoda/engine/engine_args.h"

namespace pagoda::cli {

struct EngineOptions {
  engine::EngineArgs args;   ///< defaults: the command's, set before add_engine_options
  HiCacheOptions hicache{};  ///< parsed into args.hicache by resolve()

  /// `args` with the --hicache-* block parsed in (Error(kInvalidArgument) naming a bad flag).
  engine::EngineArgs resolve() const;
};

/// Registers the flags on `cmd`; the defaults shown are the current values of `o`, which must
/// outlive the parse.
void add_engine_options(CLI::App* cmd, EngineOptions& o);

/// Registers --host, --port (0 = any free port) and --threads (help: `threads_help`).
void add_listen_options(CLI::App* cmd, std::string& host, int& port, int& threads,
                        const char* threads_help);

}  // namespace pagoda::cli
