#pragma once
/// Internal to backends/amx: the operands of the extend loop (amx_batch_attention.cpp) and its two
/// products per query tile and key block, S = Q·Kᵀ and acc += P·V, on one of two paths:
///   kTiles  — pagoda's AMX micro-kernels (kernels/cpu/amx_tile.h) on bf16 operands, K packed in
///             groups of 16 keys and V in pairs of keys by 16-column blocks (the tiles' B layout,
///             so every B tile is 1 KB of contiguous memory); CPUs with AMX, head dims that are
///             multiples of 32 (amx_tiles_fit).
///   kOnednn — oneDNN's matmul (kernels/cpu/onednn_linear.h OnednnMatmul) on row-major K / V, in
///             bf16 where oneDNN has a bf16 matmul, else f32 holding the same bf16 values.
/// Both give the same exact bf16 × bf16 products; only the f32 accumulation order differs.
/// Shapes are padded: head dims to multiples of 32 (AmxDims) and query rows to multiples of 32,
/// with zeros (zero rows and columns change no product); keys to multiples of kAmxKeyAlign.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/kernels/cpu/onednn_linear.h"

namespace pagoda::backends::amx_detail {

enum class AmxPath { kTiles, kOnednn };

/// Whether kTiles takes these head dims (multiples of 32; the caller checks the CPU).
constexpr bool amx_tiles_fit(int64_t dq, int64_t dv) {
  return dq % 32 == 0 && dv % 32 == 0;
}

/// x rounded up to a multiple of m.
constexpr int64_t amx_round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

/// Head dims and their padded widths (multiples of 32).
struct AmxDims {
  int64_t dq = 0, dv = 0, dqp = 0, dvp = 0;
  static AmxDims of(int64_t dq, int64_t dv) {
    return {dq, dv, amx_round_up(dq, 32), amx_round_up(dv, 32)};
  }
};

/// Operand storage of `t` elements (bf16 bits or f32; every value stored is bf16-exact). Grows
/// only: it keeps its allocation run after run, and nothing is zeroed that is overwritten.
class AmxOperand {
 public:
  /// Room for n elements of t (contents unspecified).
  void reserve(DType t, size_t n);
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(words_.data()); }
  const unsigned char* bytes() const {
    return reinterpret_cast<const unsigned char*>(words_.data());
  }
  uint32_t* words() { return words_.data(); }
  const uint32_t* words() const { return words_.data(); }
  /// Elements [i, i + width): the bf16 row `src` of n <= width values, then zeros.
  void set_row(size_t i, const uint16_t* src, int64_t n, int64_t width);
  /// Elements [i, i + n) = 0.
  void zero(size_t i, size_t n);

 private:
  DType t_ = DType::kBF16;
  std::vector<uint32_t> words_;
};

/// One (request, KV head)'s keys and values in the path's layout, zero-padded to a multiple of
/// kAmxKeyAlign keys (and, on kOnednn, to the padded head dims; kTiles takes head dims that are
/// multiples of 32 only).
class AmxHeadKv {
 public:
  /// Gathers kv_len keys; row(j) gives key j's bf16 K and V rows (dims.dq and dims.dv values).
  template <typename Row>
  void gather(AmxPath path, DType t, const AmxDims& dims, int64_t kv_len, Row&& row) {
    begin(path, t, dims, kv_len);
    if (path == AmxPath::kOnednn) {
      for (int64_t j = 0; j < kv_len; ++j) {
        const auto [k, v] = row(j);
        put_rows(j, k, v);
      }
      return;
    }
    const uint16_t* ks[16];
    const uint16_t* vs[16];
    for (int64_t g = 0; g < kv_len; g += 16) {
      for (int64_t i = 0; i < 16; ++i) {
        if (g + i < kv_len) {
          const auto [k, v] = row(g + i);
          ks[i] = k, vs[i] = v;
        } else {
          ks[i] = vs[i] = zeros_.data();
        }
      }
      put_group(g, ks, vs);
    }
  }
  int64_t kv_len() const { return kv_len_; }

 private:
  friend class AmxProducts;
  void begin(AmxPath path, DType t, const AmxDims& dims, int64_t kv_len);
  /// kOnednn: key j's rows, widened to f32 where the matmul is f32.
  void put_rows(int64_t j, const uint16_t* k, const uint16_t* v);
  /// kTiles: the 16 keys from g on (rows of zeros past kv_len) into K group g / 16 and V pairs.
  void put_group(int64_t g, const uint16_t* const* ks, const uint16_t* const* vs);

  AmxPath path_ = AmxPath::kOnednn;
  AmxDims dims_;
  int64_t kv_len_ = 0, padded_ = 0;
  AmxOperand k_, v_;
  std::vector<uint16_t> zeros_;  ///< a zero row of max(dq, dv) values (kTiles tail keys)
};

/// One thread's product engine (oneDNN: one thread at a time per matmul object).
class AmxProducts {
 public:
  /// kOnednn needs oneDNN in the build (Error(kUnsupported) otherwise); kTiles needs AMX
  /// (kernels/cpu/amx_tile.h amx_tiles_available(); the caller checks).
  explicit AmxProducts(AmxPath path);
  AmxPath path() const { return path_; }
  /// The element type of Q, P and the gathered K / V.
  DType operand_dtype() const;
  /// s[r][j] = q_r · k_{j0 + j} for rows r < rows (q: [rows][dims.dqp]) and keys j < n
  /// (j0, n multiples of kAmxKeyAlign; rows a multiple of 32).
  void scores(const AmxOperand& q, int64_t rows, const AmxHeadKv& h, int64_t j0, int64_t n,
              float* s);
  /// acc[r][x] += Σ_j p[r][j] v_{j0 + j}[x] for x < dims.dvp (p: [rows][n], acc: [rows][dvp]).
  void pv(const AmxOperand& p, int64_t rows, const AmxHeadKv& h, int64_t j0, int64_t n, float* acc);

 private:
  AmxPath path_;
  std::unique_ptr<kernels::cpu::OnednnMatmul> mm_;
};

}  // namespace pagoda::backends::amx_detail
