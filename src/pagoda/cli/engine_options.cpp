#include "pagoda/cli/engine_options.h"

#include "pagoda/cli/kernel_options_flag.h"

namespace pagoda::cli {

engine::EngineArgs EngineOptions::resolve() const {
  engine::EngineArgs a = args;
  // A pool sized from memory (CLI11 refused --pool-tokens beside these).
  if (a.kv_cache_memory > 0 || a.mem_fraction_static > 0) a.pool_tokens = 0;
  a.hicache = make_hicache_config(hicache);
  return a;
}

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  engine::EngineArgs& a = o.args;
  cmd->add_option("--backend", a.backend.attention, "attention backend (default: the platform's)");
  cmd->add_option("--prefill-backend", a.backend.prefill, "backend for extend steps");
  cmd->add_option("--decode-backend", a.backend.decode, "backend for decode steps");
  cmd->add_option("--linear-backend", a.backend.linear,
                  "backend for the linear (Mamba2) layers of a hybrid model (default: --backend's)");
  add_kernel_option_flag(cmd, a.backend.kernels);
  cmd->add_option("--page-size", a.page_size, "KV page size in tokens")->capture_default_str();
  CLI::Option* pool = cmd->add_option("--pool-tokens", a.pool_tokens, "KV pool capacity in tokens")
                          ->capture_default_str();
  cmd->add_option("--kv-cache-memory", a.kv_cache_memory,
                  "size the KV pool(s) from this many bytes instead of --pool-tokens (vLLM's "
                  "kv_cache_memory_bytes)")
      ->excludes(pool);
  cmd->add_option("--mem-fraction-static", a.mem_fraction_static,
                  "size the KV pool(s) so that weights and KV take this fraction of the device's "
                  "memory (SGLang's; the host's RAM on the CPU) instead of --pool-tokens")
      ->excludes(pool)
      ->excludes("--kv-cache-memory");
  cmd->add_option("--max-running", a.max_running, "max running requests in the engine")
      ->capture_default_str();
  cmd->add_option("--chunk-size", a.chunk_size, "chunked prefill budget (0 = off)")
      ->capture_default_str();
  cmd->add_option("--max-prefill-tokens", a.max_prefill_tokens,
                  "token budget of one prefill batch without chunking")
      ->capture_default_str();
  cmd->add_option("--policy", a.policy, "fcfs or lpm (longest prefix match)")
      ->check(CLI::IsMember({"fcfs", "lpm"}))
      ->capture_default_str();
  cmd->add_option("--dtype", a.dtype,
                  "model weights/activations: auto (f32 on the CPU, bf16 on CUDA), f32, f16, bf16")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", a.kv_dtype,
                  "KV cache: auto (the model dtype), f32, f16, bf16, fp8_e4m3, fp8_e5m2")
      ->capture_default_str();
  cmd->add_option("--cpu-gemm", a.cpu_gemm,
                  "the CPU model's GEMMs: openblas (f32 weights), onednn (bf16 weights, oneDNN "
                  "matmul; AMX / AVX512-BF16, needs AVX-512), onednn-f32, amx (bf16 weights, "
                  "pagoda's AMX GEMM; needs AMX), or auto (amx where the CPU has AMX, else onednn "
                  "where oneDNN reports avx512_core_bf16, else openblas)")
      ->check(CLI::IsMember({"openblas", "onednn", "onednn-f32", "amx", "auto"}))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--cuda-graph", [&a](const std::string& v) { a.cuda_graph = v == "on"; },
         "with the cuda backend: replay decode steps from CUDA graphs (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str(a.cuda_graph ? "on" : "off");
  cmd->add_option("--mla-prefill", a.mla_prefill,
                  "MLA models' extend steps: auto (the expanded form, per-head K/V through "
                  "kv_b_proj and the dense prefill kernels, where the step's keys fit the "
                  "activations; else absorbed) or absorbed (always over the latent rows)")
      ->check(CLI::IsMember({"auto", "absorbed"}))
      ->capture_default_str();
  cmd->add_option("--mla-window-keys", a.mla_window_keys,
                  "MLA models' expanded form: keys gathered and expanded at once; a step of more "
                  "keys attends to its prefixes in windows merged by LSE (0: as many as 1 GiB "
                  "of key scratch holds)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--overlap", [&a](const std::string& v) { a.overlap = v == "on"; },
         "overlap scheduler: prepare step N + 1 while the worker runs step N (on|off; not with "
         "speculative decoding)")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str(a.overlap ? "on" : "off");
  cmd->add_option("--max-context-len", a.max_context_len,
                  "longest request, prompt + output (0 = the model's)")
      ->capture_default_str();
  cmd->add_flag_callback("--no-radix", [&a] { a.radix_cache = false; },
                         "disable the radix prefix cache");
  cmd->add_flag_callback("--no-mixed", [&a] { a.mixed_batches = false; },
                         "no mixed extend + decode batches");
  cmd->add_option("--swa-pool", a.swa_pool,
                  "sliding-window layers' KV in their own pool: auto (on the CPU for a model "
                  "with windowed layers unless speculation or hicache is on; off on the GPU), on "
                  "(on the GPU: steps without CUDA graphs), off (one full pool, the window as a "
                  "mask)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--swa-pool-tokens", a.swa_pool_tokens,
                  "SWA pool capacity in tokens (0 = as many as --pool-tokens, or by "
                  "--swa-full-tokens-ratio when the pools are sized from memory)")
      ->capture_default_str();
  cmd->add_option("--swa-full-tokens-ratio", a.swa_full_tokens_ratio,
                  "with the pools sized from memory: SWA pool tokens per full-pool token, (0, 1]")
      ->capture_default_str();
  cmd->add_option("--max-mamba-cache-size", a.max_mamba_cache_size,
                  "hybrid (Mamba2) models: state slots for the running requests and the radix "
                  "cache's state snapshots together (0 = --max-running, twice that with the "
                  "radix cache, three times at --page-size > 1, plus --max-running x "
                  "--spec-draft-tokens when speculating)")
      ->capture_default_str();
  add_hicache_options(cmd, o.hicache);
}

void add_listen_options(CLI::App* cmd, std::string& host, int& port, int& threads,
                        const char* threads_help) {
  cmd->add_option("--host", host)->capture_default_str();
  cmd->add_option("--port", port, "0 = any free port (printed)")->capture_default_str();
  cmd->add_option("--threads", threads, threads_help)->capture_default_str();
}

}  // namespace pagoda::cli
