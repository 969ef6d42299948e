#pragma once
/// ModelOps: the dense operations of the decoder on one device (ARCHITECTURE §1: "the model's
/// layer loop is written once over an ops interface with CPU and CUDA implementations").
/// Decoder (decoder.h) sequences these calls; an implementation only computes.
///
/// Data types: weights and activations are `dtype()` (f32 on the CPU; f32, f16 or bf16 on CUDA);
/// the residual stream, logits and norm statistics are f32. All tensors are contiguous row-major
/// memory on `device()`; integer arrays (ids, positions, row indices) are int32 on `device()`.
/// Every call is enqueued on the platform's stream (synchronous on the CPU), never synchronizes,
/// never allocates after construction except in upload(), and is capturable into a CUDA graph.
/// Shapes are checked by the caller (Decoder); implementations trust them.
///
/// Thread rules: one thread drives an ops object.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/device.h"
#include "pagoda/core/dtype.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

/// One row's sampling parameters as the device reads them (plain data; a device array of these
/// is staged per step so a captured graph samples with new values on replay).
struct SampleRow {
  float temperature = 0.f;  ///< 0 = greedy
  int32_t top_k = 0;        ///< <= 0 = all
  float top_p = 1.f;        ///< (0, 1]
  float min_p = 0.f;        ///< [0, 1)
  uint64_t seed = 0;
  int64_t step = 0;         ///< the index of the token being sampled within its request
};

/// One logit changed before sampling (logit_processing.h builds them): row `row`'s logit l of
/// `token` becomes l1 = l + bias, l2 = l1 > 0 ? l1 / rep : l1 * rep, l2 - sub. A row lists each
/// token at most once. Plain data, uploaded as an array (cuda_ops mirrors the layout).
struct LogitAdjust {
  int32_t row = 0;
  int32_t token = 0;
  float bias = 0.f;  ///< logit_bias
  float rep = 1.f;   ///< repetition penalty (1 = none)
  float sub = 0.f;   ///< presence + frequency penalties
};

/// 32-bit words of one row's token bitmask over `vocab` tokens: ceil(vocab / 32).
constexpr int64_t token_mask_words(int64_t vocab) { return (vocab + 31) / 32; }

/// Where qkv_rope_store writes the new tokens' K and V: one layer's paged cache (slot-major
/// [num_slots, hkv, head_dim] in the ops' dtype) and the device slot of each token.
struct KvStore {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* out_cache_loc = nullptr;  ///< [rows], device
  int64_t num_slots = 0;
};

class ModelOps {
 public:
  virtual ~ModelOps() = default;
  /// Weight and activation dtype.
  virtual DType dtype() const = 0;
  virtual platform::Platform& platform() const = 0;
  Device device() const { return platform().device(); }

  /// The weight array `host` (f32) in dtype() on the device (rounded to nearest even), valid
  /// while the ops live. Device ops copy it into memory they own; the CPU ops (f32) return
  /// host.data() itself, so `host` must outlive the ops (a LlamaModel's weights do). Synchronous.
  virtual void* upload(std::span<const float> host) = 0;
  /// A copy of `host` kept in f32 on the device and owned by the ops (RoPE frequencies); the
  /// argument may be a temporary.
  virtual float* upload_f32(std::span<const float> host) = 0;
  /// A GEMM weight matrix or the embedding table given as bf16 bits (a checkpoint loaded with
  /// LoadOptions::keep_bf16), for prepare_linear / linear / swiglu_linear and embed() only, with
  /// upload()'s lifetime rules. The
  /// default widens it and calls upload() (right for ops that copy); the CPU ops override it
  /// (their bf16 GEMM modes use the array in place, the others widen into a copy they own).
  virtual void* upload_bf16(std::span<const uint16_t> host);

  /// out[t, :] = table[ids[t] - vocab_begin, :] for t < rows when vocab_begin <= ids[t] <
  /// vocab_begin + vocab_rows, else zeros (a vocabulary-parallel shard of `vocab_rows` rows;
  /// vocab_rows = vocab, vocab_begin = 0 unsharded). ids are >= 0 (checked by the caller).
  virtual void embed(const void* table, const int32_t* ids, void* out, int64_t rows,
                     int64_t hidden, int64_t vocab_begin, int64_t vocab_rows) = 0;
  /// Copies `height` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (rows
  /// `dst_pitch` bytes apart), both on the device (interleaves vocabulary shards of logits).
  virtual void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                       int64_t width, int64_t height) = 0;
  /// Fused residual + RMSNorm: residual = x (first) or residual += x (f32), then
  /// out = residual / sqrt(mean(residual²) + eps) * weight.
  virtual void add_rms_norm(const void* x, float* residual, const void* weight, void* out,
                            int64_t rows, int64_t hidden, float eps, bool first) = 0;
  /// out[t, :] = rms_norm(residual[row_index[t], :]) * weight for t < rows (final norm of the
  /// logit rows only).
  virtual void rms_norm_rows(const float* residual, const int32_t* row_index, const void* weight,
                             void* out, int64_t rows, int64_t hidden, float eps) = 0;
  /// Readies the uploaded weight w [n, k] for linear() at that shape, so the first request
  /// does not pay for it: the CPU ops' oneDNN modes pack (round to bf16 and reorder) it now
  /// instead of on its first linear(). A no-op elsewhere (the default), and for a weight already
  /// ready; a weight never prepared is readied on first use. Synchronous.
  virtual void prepare_linear(const void* w, int64_t n, int64_t k) { (void)w, (void)n, (void)k; }
  /// y[m, n] = x[m, k] · w[n, k]ᵀ (HF [out, in] weights); y is dtype() or, with f32_out, f32.
  virtual void linear(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                      bool f32_out = false) = 0;
  /// Splits qkv [rows, (hq + 2 hkv) d] into q [rows, hq, d], k, v [rows, hkv, d], adding the
  /// optional fused bias [(hq + 2 hkv) d] first, and rotates q and k (NeoX layout, f32 angles
  /// float(positions[t]) * inv_freq[i]).
  virtual void qkv_rope(const void* qkv, const void* bias, const int32_t* positions,
                        const float* inv_freq, void* q, void* k, void* v, int64_t rows, int hq,
                        int hkv, int head_dim) = 0;
  /// qkv_rope that writes k and v straight into the paged cache at out_cache_loc (q as before),
  /// in one launch where the implementation has it; returns false (nothing enqueued) otherwise,
  /// and the caller runs qkv_rope and lets the attention backend append the K/V.
  virtual bool qkv_rope_store(const void* qkv, const void* bias, const int32_t* positions,
                              const float* inv_freq, void* q, const KvStore& cache, int64_t rows,
                              int hq, int hkv, int head_dim) {
    return false;
  }
  /// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i].
  virtual void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter) = 0;
  /// y[m, n] = (silu(g) * u)[m, k] · w[n, k]ᵀ with g, u the halves of gate_up [m, 2k], in one
  /// fused op where the implementation has one for this shape; returns false (nothing
  /// enqueued) otherwise, and the caller runs silu_mul + linear.
  virtual bool swiglu_linear(const void* gate_up, const void* w, void* y, int64_t m, int64_t n,
                             int64_t k) {
    return false;
  }
  /// x = cap * tanh(x / cap), f32, in place.
  virtual void soft_cap(float* x, int64_t n, float cap) = 0;

  // ---- Gemma's extra dense ops ----
  /// Whether scale / rms_norm_groups / gelu_tanh_mul are implemented. The defaults below throw
  /// Error(kUnsupported); the Decoder checks this first and refuses a Gemma model on ops
  /// without them, naming the device.
  virtual bool supports_gemma_ops() const { return false; }
  /// x[i] = x[i] * s for i < n (dtype() elements, f32 product, one rounding), in place.
  virtual void scale(void* x, int64_t n, float s);
  /// In-place RMSNorm of `groups` vectors of `dim` per row: for t < rows, g < groups, the
  /// vector v at x + t * row_stride + g * dim (elements) becomes v / sqrt(mean(v²) + eps) *
  /// weight[0, dim) (f32 math). Gemma's post-block norms (groups 1) and q/k norms (a row of the
  /// fused qkv, groups = heads).
  virtual void rms_norm_groups(void* x, int64_t rows, int64_t row_stride, int64_t groups,
                               int64_t dim, const void* weight, float eps);
  /// GeGLU: out[t, i] = gelu_tanh(g) * u with g, u = gate_up[t, i], gate_up[t, inter + i] and
  /// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/π) (g + 0.044715 g³))) (HF gelu_pytorch_tanh).
  virtual void gelu_tanh_mul(const void* gate_up, void* out, int64_t rows, int64_t inter);

  // ---- Mamba2's extra dense ops (hybrid models: model/mamba2_mixer.h) ----
  /// Whether add_bias and gated_rms_norm are implemented. The defaults below throw
  /// Error(kUnsupported); the Mamba2 mixer refuses ops without them, naming the device.
  virtual bool supports_mamba_ops() const { return false; }
  /// x[t, i] += bias[i] for t < rows, i < n, in place (an f32 add, one rounding to x's dtype).
  /// x is [rows, n] contiguous in `x_dtype` (f32 or dtype()); bias [n] is f32.
  virtual void add_bias(void* x, DType x_dtype, const float* bias, int64_t rows, int64_t n);
  /// Mamba2's gated RMSNorm, the gate first (Bamba's norm_before_gate=False): for t < rows,
  /// v = y[t, :] ⊙ SiLU(z[t, :]) (SiLU(a) = a / (1 + exp(-a))), then within each of `groups`
  /// equal groups of `dim`, out[t, i] = v_i · (1 / sqrt(Σ_group v² / group + eps) · weight[i]),
  /// all f32, rounded once to dtype(). y [rows, dim] f32 contiguous; z f32 with rows `z_stride`
  /// floats apart; weight [dim] f32; out [rows, dim] dtype() (may not alias y or z).
  virtual void gated_rms_norm(const float* y, const float* z, int64_t z_stride,
                              const float* weight, void* out, int64_t rows, int64_t dim,
                              int64_t groups, float eps);

  // ---- DeepSeek MLA's extra dense ops ----
  /// Whether rope_interleaved, linear_groups and merge_attention are implemented. The default
  /// throws Error(kUnsupported); the Decoder refuses an MLA model on ops without it, naming the
  /// device.
  virtual bool supports_mla_ops() const { return false; }
  /// Interleaved-pair RoPE (DeepSeek's layout) in place: for t < rows, g < groups, the vector v
  /// of `dim` elements at x + t * row_stride + g * group_stride has each pair (v[2i], v[2i+1])
  /// rotated by the f32 angle float(positions[t]) * inv_freq[i], both then multiplied by
  /// `factor` (YaRN's cos / sin scale; 1 otherwise): v[2i] = f (a cos - b sin), v[2i+1] =
  /// f (b cos + a sin).
  virtual void rope_interleaved(void* x, int64_t rows, int64_t row_stride, int64_t groups,
                                int64_t group_stride, int64_t dim, const int32_t* positions,
                                const float* inv_freq, float factor);
  /// MLA's per-head projections (W_UK into the queries, W_UV out of the latent output) in one
  /// call: for g < groups, t < m, j < n
  ///   y[t·y_pitch + g·y_group + j] = Σ_{i<k} x[t·x_pitch + g·x_group + i] · w[(g·n + j)·k + i]
  /// (w [groups, n, k]: each group's HF [out, in] matrix), elements of dtype(), pitches and
  /// group offsets in elements. The default throws Error(kUnsupported) (supports_mla_ops).
  virtual void linear_groups(const void* x, int64_t x_pitch, int64_t x_group, const void* w,
                             void* y, int64_t y_pitch, int64_t y_group, int64_t m, int64_t n,
                             int64_t k, int64_t groups);
  /// Merges one key window's attention state into an accumulator (the expanded form's windows,
  /// Decoder::mla_attention), per (row, head) state of rows × heads: part_o [.., dv] in dtype()
  /// with its base-2 LSE part_lse (f32, AttentionBackend::forward_ragged's), acc_o [.., dv] and
  /// acc_lse f32. first: acc = part. Otherwise with a = acc_lse, b = part_lse, m = max(a, b):
  /// acc_o = (2^(a-m)·acc_o + 2^(b-m)·part_o) / (2^(a-m) + 2^(b-m)), acc_lse = m +
  /// log2(2^(a-m) + 2^(b-m)); two -inf states (no key seen) give 0 and -inf. With `out`
  /// (dtype(), [rows, heads, dv]) the merged values are also written there, rounded once. f32
  /// math. The default throws Error(kUnsupported) (supports_mla_ops).
  virtual void merge_attention(const void* part_o, const float* part_lse, float* acc_o,
                               float* acc_lse, void* out, int64_t rows, int64_t heads, int64_t dv,
                               bool first);

  // ---- DeepSeek DSA's extra dense ops (the lightning indexer, model/dsa_indexer.h) ----
  /// Whether layer_norm_f32, rope_neox_f32, scale_f32 and store_index_keys are implemented. The
  /// defaults below throw Error(kUnsupported); the Decoder refuses a DSA model on ops without
  /// them, naming the device.
  virtual bool supports_dsa_ops() const { return false; }
  /// LayerNorm in place on x [rows, dim] (f32): v = (v - mean(v)) / sqrt(var(v) + eps) ·
  /// weight + bias (the biased variance), weight and bias [dim] f32 (upload_f32). Statistics
  /// in f64 on the CPU, in f32 (two passes) on CUDA.
  virtual void layer_norm_f32(float* x, int64_t rows, int64_t dim, const float* weight,
                              const float* bias, float eps);
  /// NeoX-pair RoPE in place on the first `rope` dims of each of `groups` vectors of `dim` per
  /// row of x [rows, groups·dim] (f32): for i < rope / 2 the pair (v[i], v[i + rope/2]) is
  /// rotated by the f32 angle float(positions[t]) · inv_freq[i], cos and sin each multiplied by
  /// `factor`: v[i] = a c − b s, v[i + rope/2] = b c + a s.
  virtual void rope_neox_f32(float* x, int64_t rows, int64_t groups, int64_t dim, int64_t rope,
                             const int32_t* positions, const float* inv_freq, float factor);
  /// x[i] = x[i] · s for i < n (f32), in place.
  virtual void scale_f32(float* x, int64_t n, float s);
  /// Quantises rows of k [rows, dim] (f32) into a DSA index-key buffer (kv_pool.h's layout,
  /// kv::quantize_index_key's rule, bit for bit): row t goes to index_rows + loc[t] ·
  /// row_bytes (row_bytes = dim + 4). loc [rows] is device memory with valid slots (the
  /// caller's out_cache_loc).
  virtual void store_index_keys(const float* k, const int32_t* loc, int64_t rows, int64_t dim,
                                void* index_rows, int64_t row_bytes);

  /// Samples one id per row of logits [rows, vocab] (f32) with params[rows] (device memory);
  /// writes out_ids[rows] (device memory). Deterministic in (logits, seed, step).
  virtual void sample(const float* logits, const SampleRow* params, int32_t* out_ids, int64_t rows,
                      int64_t vocab) = 0;

  /// Applies adj[n] (device memory) to logits [rows, vocab] (f32) in place; rows and tokens are
  /// in range (the caller checks) and no (row, token) appears twice.
  virtual void adjust_logits(float* logits, int64_t vocab, const LogitAdjust* adj, int64_t n) = 0;
  /// Structured output's token masks, in place on logits [.., vocab] (f32): for i < *count,
  /// logit row rows[i] keeps token t only where bit t % 32 of mask[i * W + t / 32] is set
  /// (W = token_mask_words(vocab)); every other logit of the row becomes -inf. Bits at or past
  /// vocab and mask rows at or past *count are never read. rows, mask and count are device
  /// memory; *count <= max_rows, the rows are in range and distinct (the caller checks). The
  /// work is sized for max_rows, so a captured graph replays it with any staged count (0: a
  /// no-op).
  virtual void mask_logits(float* logits, int64_t vocab, const int32_t* rows,
                           const uint32_t* mask, const int32_t* count, int64_t max_rows) = 0;

  /// Top-`k` (k in [1, 16]) log-probabilities of each logit row [rows, vocab] (f32, device
  /// memory): ids [rows, k] sorted by logit descending then id ascending, logprobs [rows, k] =
  /// logit − logsumexp(row) (device memory; cuda_kernels::launch_topk_logprobs). Returns false
  /// (nothing enqueued) where the ops have no such kernel: the caller then reads whole rows.
  virtual bool top_k_logprobs(const float* logits, int64_t rows, int64_t vocab, int k,
                              int32_t* ids, float* logprobs) {
    (void)logits, (void)rows, (void)vocab, (void)k, (void)ids, (void)logprobs;
    return false;
  }

  /// For every buffer in `bases` (device memory, rows of `row_bytes`) copies row src[i] to row
  /// dst[i], every source read before any destination is written (overlap-safe); enqueued on the
  /// stream. Rows must be in range (the caller checks). Returns false (nothing done) where the
  /// ops have no such kernel (the caller then copies through the host: KvPool::move_kv).
  virtual bool move_rows(std::span<void* const> bases, size_t row_bytes,
                         std::span<const int32_t> src, std::span<const int32_t> dst) {
    (void)bases, (void)row_bytes, (void)src, (void)dst;
    return false;
  }

  // ---- CUDA graphs (optional) ----
  /// Whether capture() works (CUDA); false on the CPU.
  virtual bool supports_graphs() const { return false; }
  /// A captured sequence of enqueued work that replays with the same addresses.
  class Graph {
   public:
    virtual ~Graph() = default;
    /// Enqueues the captured work on the platform's stream.
    virtual void replay() = 0;
  };
  /// Captures everything `body` enqueues on the stream into a graph. Throws Error(kUnsupported)
  /// where supports_graphs() is false, kInternal when capture fails.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& body);
};

/// Which library computes the CPU ops' GEMMs (`--cpu-gemm`; docs/design/model.md "CPU GEMMs").
/// Activations, the residual stream and the GEMMs' outputs are f32 in every mode.
enum class CpuGemm : uint8_t {
  kOpenBlas,   ///< "openblas": f32 weights, cblas_sgemm (the default)
  kOnednn,     ///< "onednn": bf16 weights (rounded to nearest even), oneDNN matmul on bf16
               ///< activations, f32 accumulation (AMX / AVX512-BF16; needs AVX-512)
  kOnednnF32,  ///< "onednn-f32": f32 weights through oneDNN's matmul (A/B against OpenBLAS)
  kAmx,        ///< "amx": bf16 weights packed as AMX tiles, pagoda's AMX GEMM on bf16
               ///< activations, f32 accumulation (kernels/cpu/amx_linear.h; needs AMX)
};

/// "openblas", "onednn", "onednn-f32", "amx".
std::string_view cpu_gemm_name(CpuGemm gemm);
/// The mode named `name` (cpu_gemm_name's spellings); nullopt for another name.
std::optional<CpuGemm> parse_cpu_gemm(std::string_view name);
/// Why `gemm` cannot run on this CPU in this build ("" when it can): oneDNN missing from the
/// build, or no bf16 matmul in oneDNN on this CPU (kernels/cpu/onednn_linear.h), or no AMX.
std::string cpu_gemm_unavailable(CpuGemm gemm);
/// What `--cpu-gemm auto` picks: kAmx where the CPU has AMX (faster than oneDNN 2.6's matmul
/// there, docs/design/model.md "CPU GEMMs"), else kOnednn where oneDNN reports avx512_core_bf16
/// (native bf16 arithmetic), else kOpenBlas.
CpuGemm auto_cpu_gemm();
/// True for the modes whose GEMMs read bf16 weights (onednn, amx): a bf16 checkpoint's matrices
/// can stay bf16 from the file to the packed copy (LoadOptions::keep_bf16).
bool cpu_gemm_reads_bf16(CpuGemm gemm);

/// The CPU implementation: f32 activations; GEMM weights per `gemm` (kOpenBlas: the caller's f32
/// arrays in place; the oneDNN and amx modes: a packed copy of each weight matrix (from f32, or
/// from bf16 uploaded by upload_bf16) made by
/// prepare_linear() -- the Decoder prepares its layers' and the LM head's at construction -- or
/// else when linear() first sees it, keyed by (w, n, k), owned by the ops). Throws
/// Error(kUnsupported) for a dtype other than f32 or a `gemm` cpu_gemm_unavailable refuses.
/// `platform` must be a CPU platform and outlive the ops.
std::unique_ptr<ModelOps> make_cpu_ops(platform::Platform& platform, DType dtype,
                                       CpuGemm gemm = CpuGemm::kOpenBlas);

}  // namespace pagoda::model
