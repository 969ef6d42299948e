#pragma once
/// AmxLinear: one weight matrix of a linear layer, y[m, n] = x[m, k] · w[n, k]ᵀ (HF [out, in]
/// layout), on pagoda's AMX bf16 GEMM: the CPU model's `--cpu-gemm amx` (docs/design/model.md
/// "CPU GEMMs"). bf16 × bf16 products (exact in f32), f32 accumulation and output — the numerics
/// of `--cpu-gemm onednn` but for the summation order and forward()'s rounding of the f32
/// activations (vcvtneps2bf16: nearest even, denormal inputs flushed to zero; onednn_linear
/// rounds them with core's f32_to_bf16_bits).
///
/// Weights: rounded to bf16 (nearest even, subnormals kept; bf16 weights are taken as they are)
/// once, at construction, and packed as
/// AMX B tiles by amx_pack_k_group (amx_blocks.h): per
/// block of 32 output columns and 32 inputs two 1 KB tiles [16 input pairs][16 columns], the
/// blocks of one column block contiguous along k (n and k zero-padded to multiples of 32).
/// Activations: rounded to bf16 per call into a row-major operand whose row stride is k rounded
/// up to 32 plus 32 elements (so the 16 rows of a tile load are not 4 KiB apart and do not share
/// an L1 set), padded with rows to 16 (m ≤ 16) or a multiple of 32 (their results are dropped).
/// Product: OpenMP threads take (group of kPanelBlocks column blocks, 32-row block) pairs; a pair
/// runs its k range in chunks of kChunk inputs (the 32 × kChunk activation chunk stays in L1 while
/// the group's column blocks stream their weights past it), four 16 × 16 f32 accumulator tiles per
/// column block, loaded and stored between chunks; rows m ≤ 16 use one activation tile (half the
/// TMUL work: decode). Whole 32 × 32 blocks are stored straight into y, edge blocks through
/// scratch.
///
/// Availability: CPUs with AMX (amx_support.h); elsewhere amx_linear_unavailable() says so and a
/// construction throws Error(kUnsupported) with that reason.
/// Thread rules: one thread calls forward() at a time (it runs on the OpenMP threads); the
/// operand and accumulator buffers belong to the calling thread and are shared by all of its
/// AmxLinear objects (a model's layers run one product at a time).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pagoda::kernels::cpu {

/// Why AmxLinear cannot run here ("" when it can).
std::string amx_linear_unavailable();

class AmxLinear {
 public:
  /// Column blocks of 32 per work item (the weights a 32-row block streams per k chunk).
  static constexpr int kPanelBlocks = 8;
  /// Inputs per k chunk (a multiple of 32).
  static constexpr int kChunk = 256;
  /// 32-row blocks that share one pass over a column group's weights.
  static constexpr int kRowBlocks = 8;

  /// Packs w [n, k] (f32, row-major) as bf16 B tiles. n, k >= 1. Throws Error(kUnsupported)
  /// with amx_linear_unavailable's reason, Error(kInvalidArgument) for n or k < 1.
  AmxLinear(const float* w, int64_t n, int64_t k);
  /// The same from bf16 weights (uint16 bits, row-major [n, k]), packed as they are: the packed
  /// bytes equal those of the f32 constructor on the widened values.
  AmxLinear(const uint16_t* w_bf16, int64_t n, int64_t k);
  ~AmxLinear();
  AmxLinear(AmxLinear&&) noexcept;
  AmxLinear& operator=(AmxLinear&&) noexcept;

  /// y[m, n] = x[m, k] · wᵀ (f32 in and out, row-major, no aliasing). m >= 0.
  void forward(const float* x, float* y, int64_t m);
  /// The operand of an m-row product: m rows of k bf16 values (uint16 bits, rounded by the
  /// caller) input_ld() elements apart, which the caller fills and then runs with
  /// forward_input(y, m). The padding columns (k..) are zero; rows past m are not read into y.
  /// The buffer is the calling thread's, shared by every AmxLinear: valid until the next
  /// input() or forward() of any of them on this thread.
  uint16_t* input(int64_t m);
  /// Elements between the rows of input().
  int64_t input_ld() const;
  /// y[m, n] = input · wᵀ (f32) for the m rows the thread's last input(m) readied, which must
  /// have been this object's; anything else throws Error(kInvalidArgument).
  void forward_input(float* y, int64_t m);

  int64_t n() const;
  int64_t k() const;
  /// Bytes of the packed weights.
  size_t weight_bytes() const;

 private:
  /// Both constructors: rounds (f32) or copies (bf16) w into the packed B tiles.
  template <typename T>
  void pack(const T* w, int64_t n, int64_t k);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::kernels::cpu
