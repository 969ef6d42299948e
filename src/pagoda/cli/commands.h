#pragma once
/// Subcommands of the `pagoda` CLI. Each lives in its own <name>_command.cpp and registers itself
/// on the root app; main.cpp calls every add_*_command in the order they appear in --help.
/// A subcommand reports bad input as pagoda::Error; main prints it and exits with status 2.

#include <CLI/CLI.hpp>

#include <string>

#include "pagoda/engine/engine.h"
#include "pagoda/platform/platform.h"

namespace pagoda::cli {

/// `pagoda version`: prints the version and the build's capabilities.
void add_version_command(CLI::App& app);
/// `pagoda conformance`: every attention backend × case against the reference; non-zero exit on
/// any failure; prints the backend × feature matrix (Markdown).
void add_conformance_command(CLI::App& app);

/// `pagoda kernels`: times a BatchAttention backend (cpu, reference) on one synthetic paged shape
/// (--op decode|extend|verify) and prints ms, GB/s, TFLOP/s and % of the machine's measured
/// ceiling (read bandwidth for decode, OpenBLAS sgemm for extend/verify); --json for one object.
void add_kernels_command(CLI::App& app);

/// `pagoda replay`: replays a synthetic multi-turn chat workload through the page allocator and
/// radix cache like a scheduler (--requests, --page-size, --pool-tokens, --seed, --policy,
/// --json) and prints prefix hit rate, pages in use / peak, evictions and operations per second.
void add_replay_command(CLI::App& app);

/// `pagoda generate`: one generation on the engine (builtin model or a HF checkpoint folder),
/// streamed to stdout; --json prints one object (output_token_ids, output_text, ...).
void add_generate_command(CLI::App& app);

/// `pagoda tokenize`: encodes --text with the tokenizer of --model (builtin, or a folder with
/// tokenizer.json / tokenizer.model) and prints the ids ({"ids": [...]} with --json); with
/// --decode prints the text of --ids. --no-special: no BOS/template tokens (encode), special
/// tokens left out (decode).
void add_tokenize_command(CLI::App& app);

/// `pagoda tp-follower` (hidden): a tensor-parallel rank > 0, started by `--tp N`.
void add_tp_follower_command(CLI::App& app);

/// The tensor-parallel group behind `--tp N`: nothing for N = 1, an in-process group (one thread
/// per rank) on the CPU, one process per GPU over NCCL on CUDA (ranks 1..N-1 start at once and
/// load the model while the caller loads its own). Keep it alive longer than the engine.
class TpRunner {
 public:
  TpRunner();
  ~TpRunner();
  TpRunner(TpRunner&&) noexcept;
  TpRunner& operator=(TpRunner&&) noexcept;
  /// The Engine worker factory (empty for N = 1). Call once.
  engine::WorkerFactory factory(platform::Platform& platform);

 private:
  friend TpRunner start_tp(int, const platform::Platform&, const std::string&, uint64_t);
  struct Groups;
  std::unique_ptr<Groups> groups_;
};

/// Starts the group for `--tp tp` (Error(kInvalidArgument) outside [1, 64]; kUnsupported
/// without NCCL or GPUs enough on CUDA).
TpRunner start_tp(int tp, const platform::Platform& platform, const std::string& model,
                  uint64_t weight_seed);
/// Registers `--tp N` (default 1) of generate, bench and serve.
void add_tp_option(CLI::App* cmd, int& tp);

/// Prepares the process for running the model on this host: OpenBLAS single-threaded (the
/// attention backend owns the OpenMP threads) and OpenMP waiting passively, so BLAS and OpenMP do
/// not spin against each other. OMP_WAIT_POLICY is read when the runtime loads, so when it is
/// unset this re-executes the process with OMP_WAIT_POLICY=passive (never returns then).
void prepare_host_threads();

/// `pagoda bench`: synthetic serving workload on the engine (shared system prompts, multi-turn
/// follow-ups); progress on stderr, then a summary table or one JSON object (--json).
void add_bench_command(CLI::App& app);

/// `pagoda serve`: the OpenAI-compatible HTTP server (src/pagoda/server); in a build without
/// cpp-httplib it fails with a message saying so.
void add_serve_command(CLI::App& app);
/// `pagoda router`: the front of prefill–decode disaggregation (src/pagoda/server/router.h).
void add_router_command(CLI::App& app);

}  // namespace pagoda::cli
