#pragma once
/// OnednnLinear: one weight matrix of a linear layer, y[m, n] = x[m, k] · w[n, k]ᵀ (HF [out, in]
/// layout), kept in `weight_dtype` (bf16: half the bytes of f32) and computed by oneDNN's matmul
/// primitive (AMX tiles on Sapphire Rapids, AVX512-BF16 on Zen 4 / Cooper Lake, its own choice).
/// The CPU model's `--cpu-gemm onednn` path (docs/design/model.md "CPU GEMMs").
///
/// The weights are rounded (nearest even) and reordered once, at construction, into the layout
/// oneDNN's matmul prefers for them (format_tag::any, queried for a reference M). Activations
/// arrive in f32 and are rounded to `weight_dtype` per call (oneDNN 2.6 has no mixed f32 × bf16
/// matmul), or are written by the caller straight into the operand buffer in `weight_dtype`
/// (input() + forward_input(): a producer that rounds as it writes, e.g. the CPU ops' fused
/// SwiGLU, saves the f32 pass); the product accumulates and lands in f32. One primitive per
/// distinct M is built on first use and cached (the most recent kMaxCached M values), against the
/// packed weights' layout. M past 32 rows runs as its whole 32-row blocks plus one zero-padded
/// block for the remaining rows (oneDNN 2.6's AMX matmul runs an M tail far slower:
/// onednn_linear.cpp kOnednnRowBlock).
///
/// Availability: oneDNN 2.6 implements bf16 matmul only on CPUs with AVX-512 (avx512_core and
/// up); elsewhere (AVX2 machines) onednn_linear_unavailable(kBF16) says so, and a construction
/// throws Error(kUnsupported) with that reason. f32 weights run everywhere oneDNN does (tests of
/// the packing and caching on any CPU). Without oneDNN in the build every query says that.
///
/// Thread rules: one thread calls forward() at a time (oneDNN runs it on its OpenMP threads).
///
/// OnednnMatmul (below) is the same primitive for operands that change every call (the amx
/// attention backend's Q·Kᵀ and P·V blocks): nothing is packed, primitives are cached by shape.

#include <cstdint>
#include <memory>
#include <string>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels::cpu {

/// Why oneDNN cannot compute a matmul with `weight_dtype` (kF32 or kBF16) weights on this CPU
/// in this build ("" when it can): no oneDNN in the build, a dtype it has no matmul for here
/// (naming the ISA oneDNN found), or a dtype other than f32 / bf16.
std::string onednn_linear_unavailable(DType weight_dtype);

/// The CPU ISA oneDNN dispatches to (e.g. "avx2", "avx512_core_bf16", "avx512_core_amx"); "none"
/// without oneDNN in the build.
std::string onednn_isa_name();

/// True when oneDNN reports native bf16 arithmetic here: avx512_core_bf16 or AMX (`--cpu-gemm
/// auto` picks oneDNN on such a CPU when it has no AMX: with AMX it picks pagoda's AMX GEMM).
bool onednn_has_native_bf16();

class OnednnLinear {
 public:
  /// Copies w [n, k] (f32, row-major) in weight_dtype into oneDNN's packed layout. n, k >= 1.
  /// Throws Error(kUnsupported) with onednn_linear_unavailable's reason.
  OnednnLinear(const float* w, int64_t n, int64_t k, DType weight_dtype);
  /// The same from bf16 weights (uint16 bits, row-major [n, k]; weight_dtype kBF16), reordered
  /// as they are: the packed copy equals the f32 constructor's on the widened values.
  OnednnLinear(const uint16_t* w_bf16, int64_t n, int64_t k);
  ~OnednnLinear();
  OnednnLinear(OnednnLinear&&) noexcept;
  OnednnLinear& operator=(OnednnLinear&&) noexcept;

  /// y[m, n] = x[m, k] · wᵀ (f32 in and out, row-major, no aliasing). m >= 0.
  void forward(const float* x, float* y, int64_t m);
  /// The operand buffer for an m-row product: [m, k] row-major in the weights' dtype (bf16 as
  /// uint16 bits, RNE-rounded by the caller, or f32), which the caller fills and then runs with
  /// forward_input(y, m). Its padding rows are already zero. Valid until the next call on this
  /// object.
  void* input(int64_t m);
  /// y[m, n] = input · wᵀ (f32) for the m rows the last input(m) readied; any other m throws
  /// Error(kInvalidArgument).
  void forward_input(float* y, int64_t m);

  int64_t n() const;
  int64_t k() const;
  /// Bytes of the packed weights oneDNN holds.
  size_t weight_bytes() const;

  /// Distinct M values kept with a built primitive.
  static constexpr size_t kMaxCached = 32;

 private:
  /// Both constructors: w [n, k] in weight_dtype (f32, or bf16 bits) reordered into impl_.
  void pack(const void* w, int64_t n, int64_t k, DType weight_dtype);
  /// The product of m rows of x (the weights' dtype; past 32 rows, readable up to the end of
  /// the zero-padded tail block).
  void run(const void* x, float* y, int64_t m);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// How OnednnMatmul::run reads B: [n, k] row-major (key rows, Q·Kᵀ) or [k, n] row-major (value
/// rows, P·V).
enum class MatmulB { kRowsAreN, kRowsAreK };
/// Whether OnednnMatmul::run overwrites C (C = A·B) or adds the product to it (C += A·B, oneDNN's
/// sum post-op: the accumulation happens inside the matmul, no separate pass over C).
enum class MatmulC { kOverwrite, kAccumulate };

/// C[m, n] = A[m, k] · B (or C += A · B) in f32 (C row-major, contiguous), A [m, k] row-major, B
/// laid out as `b_layout` says. A and B hold `operand_dtype()` elements: bf16 (as uint16 bits)
/// where oneDNN has a bf16 matmul on this CPU, else f32 — callers round their values to bf16
/// either way, so the products are the same exact bf16 × bf16 products and only the f32
/// accumulation order differs between the two.
class OnednnMatmul {
 public:
  /// Throws Error(kUnsupported) when oneDNN has neither (a build without oneDNN).
  OnednnMatmul();
  ~OnednnMatmul();
  OnednnMatmul(OnednnMatmul&&) noexcept;
  OnednnMatmul& operator=(OnednnMatmul&&) noexcept;

  /// kBF16 or kF32 (see above).
  DType operand_dtype() const;
  /// Runs the product (m, n, k >= 1). One thread at a time per object.
  void run(const void* a, const void* b, float* c, int64_t m, int64_t n, int64_t k,
           MatmulB b_layout, MatmulC c_mode = MatmulC::kOverwrite);

  /// Distinct shapes kept with a built primitive.
  static constexpr size_t kMaxCached = 64;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::kernels::cpu
