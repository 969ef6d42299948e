// AmxLinear (amx_linear.h): the packed bf16 weights, the activation operand and the tile GEMM.
#include "pagoda/kernels/cpu/amx_linear.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/core/host_memory.h"
#include "pagoda/kernels/cpu/amx_support.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define PAGODA_AMX_LINEAR_X86 1
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#else
#define PAGODA_AMX_LINEAR_X86 0
#endif

#include "pagoda/kernels/cpu/amx_blocks.h"

namespace pagoda::kernels::cpu {

namespace detail {

/// Frees the buffers of aligned_zeroed.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace detail

namespace {

using detail::FreeDeleter;

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// `count` zeroed elements of T, 64-byte aligned (large ones in huge pages: core/host_memory.h).
template <class T>
std::unique_ptr<T[], FreeDeleter> aligned_zeroed(size_t count) {
  const size_t bytes = static_cast<size_t>(round_up(static_cast<int64_t>(std::max<size_t>(
                                                        count * sizeof(T), 64)),
                                                    64));
  void* p = allocate_host(bytes, 64);
  std::memset(p, 0, bytes);
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

/// Operand rows padded to 16 (one activation tile) or a multiple of 32 (two).
int64_t padded_rows(int64_t m) { return m <= 16 ? 16 : round_up(m, 32); }

}  // namespace

std::string amx_linear_unavailable() {
  if (!PAGODA_AMX_LINEAR_X86) return "this build has no AMX code (x86-64 Linux with GCC or Clang)";
  if (!detail::amx_tiles_available())
    return "this CPU (or its OS) offers no AMX bf16 tiles (Sapphire Rapids or later)";
  return "";
}

struct AmxLinear::Impl {
  int64_t n = 0, k = 0, np = 0, kp = 0, lda = 0;
  /// [np / 32][kp / 32][2][16][16] bf16 pairs (B tiles).
  std::unique_ptr<uint32_t[], detail::FreeDeleter> w;

  void run(float* y, int64_t m) const;
};

namespace {

/// The operand and the accumulator buffers, shared by every AmxLinear the calling thread runs
/// (one product at a time per thread; a CPU model's layers thus share one set): grown to the
/// largest product seen, never shrunk.
struct Workspace {
  std::unique_ptr<uint16_t[], detail::FreeDeleter> a;
  size_t a_elems = 0;
  const void* owner = nullptr;  ///< the AmxLinear whose input() readied `a` last
  int64_t a_m = -1;             ///< and for how many rows
  std::vector<float> acc;       ///< kAccFloats per OpenMP thread (gemm)
};

Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

}  // namespace

#if PAGODA_AMX_LINEAR_X86

namespace {

#define PAGODA_AMX_LINEAR_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

/// dst[0, n) = bf16(src[0, n)) (round to nearest even).
PAGODA_AMX_LINEAR_TARGET void round_row_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
}

/// The 32-input steps [k0, k1) of one accumulator block in tiles 0-3: A tiles (rows `as` bytes
/// apart) at a0 (rows 0-15) and a1 (rows 16-31; Half: none, tiles 2-3 unused), the column
/// block's two B tiles of each step at b + kb · 512 words (amx_blocks.h's step).
template <bool Half>
PAGODA_AMX_LINEAR_TARGET inline __attribute__((always_inline)) void steps(
    const uint16_t* a0, const uint16_t* a1, int64_t as, const uint32_t* b, int64_t k0,
    int64_t k1) {
  for (int64_t kb = k0; kb < k1; ++kb) {
    if constexpr (Half) {
      _tile_loadd(4, a0 + kb * 32, as);
      _tile_loadd(6, b + kb * 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b + kb * 512 + 256, 64);
      _tile_dpbf16ps(1, 4, 7);
    } else {
      detail::amx_block_step(a0 + kb * 32, a1 + kb * 32, as, b + kb * 512, b + kb * 512 + 256, 64);
    }
  }
}

/// Floats between the rows of a thread's accumulator buffer: a column group plus 16, so its 16
/// rows of a tile are not a multiple of 4 KiB apart (y's rows often are: n a multiple of 1,024).
constexpr int64_t kAccLd = AmxLinear::kPanelBlocks * 32 + 16;
/// Floats of one thread's accumulator buffer: a row group × a column group.
constexpr int64_t kAccFloats = AmxLinear::kRowBlocks * 32 * kAccLd;

/// Column blocks [nb0, nb1) of every row block, in row groups of kRowBlocks blocks: per k chunk
/// (the group's weights for it, kPanelBlocks × kChunk × 64 bytes, stay in L2 across the row
/// group; a row block's activation chunk, 32 × kChunk bf16, in L1 across the column group) the
/// accumulator tiles of each (row block, column block) are loaded from and stored to `acc`
/// (kAccLd floats apart) between chunks; the row group's valid rows and columns go to y after
/// its last chunk.
PAGODA_AMX_LINEAR_TARGET void gemm_group(const uint16_t* a, int64_t lda, const uint32_t* w,
                                         int64_t kb_total, int64_t mblocks, bool half,
                                         int64_t nb0, int64_t nb1, float* y, int64_t m, int64_t n,
                                         float* acc) {
  const int64_t as = lda * 2, cs = kAccLd * 4;
  const int64_t rows = half ? 16 : 32;
  constexpr int64_t kChunkBlocks = AmxLinear::kChunk / 32;
  for (int64_t mg = 0; mg < mblocks; mg += AmxLinear::kRowBlocks) {
    const int64_t mg_end = std::min(mblocks, mg + AmxLinear::kRowBlocks);
    for (int64_t k0 = 0; k0 < kb_total; k0 += kChunkBlocks) {
      const int64_t k1 = std::min(kb_total, k0 + kChunkBlocks);
      for (int64_t mb = mg; mb < mg_end; ++mb) {
        const uint16_t* a0 = a + mb * 32 * lda;
        const uint16_t* a1 = a0 + 16 * lda;
        for (int64_t nb = nb0; nb < nb1; ++nb) {
          float* c = acc + (mb - mg) * 32 * kAccLd + (nb - nb0) * 32;
          // Half (rows <= 16): tiles 0-1 only, so a decode step moves half the accumulators.
          if (k0 == 0) {
            _tile_zero(0);
            _tile_zero(1);
            if (!half) {
              _tile_zero(2);
              _tile_zero(3);
            }
          } else if (half) {
            _tile_loadd(0, c, cs);
            _tile_loadd(1, c + 16, cs);
          } else {
            detail::amx_load_block(c, cs);
          }
          const uint32_t* b = w + nb * kb_total * 512;
          if (half) {
            steps<true>(a0, a1, as, b, k0, k1);
          } else {
            steps<false>(a0, a1, as, b, k0, k1);
          }
          if (half) {
            _tile_stored(0, c, cs);
            _tile_stored(1, c + 16, cs);
          } else {
            detail::amx_store_block(c, cs);
          }
        }
      }
    }
    const int64_t r0 = mg * 32, r1 = std::min(m, (mg_end - 1) * 32 + rows);
    const int64_t c0 = nb0 * 32, cols = std::min(n, nb1 * 32) - c0;
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(y + r * n + c0, acc + (r - r0) * kAccLd, static_cast<size_t>(cols) * 4);
  }
}

/// y[m, n] = a · wᵀ: the operand a (lda apart), the packed weights w of np × kp; acc holds
/// kAccFloats per OpenMP thread.
PAGODA_AMX_LINEAR_TARGET void gemm(const uint16_t* a, int64_t lda, const uint32_t* w, int64_t np,
                                   int64_t kp, int64_t n, float* y, int64_t m, float* acc) {
  const int64_t mp = padded_rows(m);
  const bool half = mp == 16;
  const int64_t mblocks = half ? 1 : mp / 32;
  const int64_t nb_total = np / 32, kb_total = kp / 32;
  const int64_t groups = (nb_total + AmxLinear::kPanelBlocks - 1) / AmxLinear::kPanelBlocks;
#pragma omp parallel
  {
    const detail::AmxTileConfig cfg;
    _tile_loadconfig(&cfg);
    float* mine = acc + omp_get_thread_num() * kAccFloats;
    // Contiguous ranges of column groups: each thread streams its weights from memory once per
    // row group.
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t nb0 = g * AmxLinear::kPanelBlocks;
      gemm_group(a, lda, w, kb_total, mblocks, half, nb0,
                 std::min(nb_total, nb0 + AmxLinear::kPanelBlocks), y, m, n, mine);
    }
    _tile_release();
  }
}

}  // namespace

void AmxLinear::Impl::run(float* y, int64_t m) const {
  Workspace& ws = workspace();
  const auto need = static_cast<size_t>(omp_get_max_threads() * kAccFloats);
  if (ws.acc.size() < need) ws.acc.resize(need);
  gemm(ws.a.get(), lda, w.get(), np, kp, n, y, m, ws.acc.data());
}

#else  // never constructed: amx_linear_unavailable() is not empty

void AmxLinear::Impl::run(float*, int64_t) const {}

#endif

namespace {

/// Element i of w as bf16 bits: f32 rounded (nearest even), bf16 as it is.
inline uint16_t bf16_at(const float* w, int64_t i) {
  return f32_to_bf16_bits(w[i]);
}
inline uint16_t bf16_at(const uint16_t* w, int64_t i) {
  return w[i];
}

}  // namespace

template <typename T>
void AmxLinear::pack(const T* w, int64_t n, int64_t k) {
  impl_ = std::make_unique<Impl>();
  const std::string why = amx_linear_unavailable();
  PAGODA_REQUIRE(why.empty(), kUnsupported, "amx linear: {}", why);
  PAGODA_REQUIRE(n >= 1 && k >= 1, kInvalidArgument, "amx linear: n {} and k {} must be >= 1", n,
                 k);
  Impl& s = *impl_;
  s.n = n;
  s.k = k;
  s.np = round_up(n, 32);
  s.kp = round_up(k, 32);
  s.lda = s.kp + 32;
  const int64_t kb_total = s.kp / 32, nb_total = s.np / 32;
  s.w = aligned_zeroed<uint32_t>(static_cast<size_t>(s.np * s.kp / 2));
  uint32_t* dst = s.w.get();
#pragma omp parallel
  {
    // The column block's 32 rows in bf16 (zero past n and past k), then per 32 inputs and 16
    // columns one B tile by amx_pack_k_group.
    std::vector<uint16_t> rows(static_cast<size_t>(32 * s.kp));
#pragma omp for schedule(static)
    for (int64_t nb = 0; nb < nb_total; ++nb) {
      std::fill(rows.begin(), rows.end(), uint16_t{0});
      for (int64_t r = 0; r < 32 && nb * 32 + r < n; ++r) {
        const T* src = w + (nb * 32 + r) * k;
        for (int64_t i = 0; i < k; ++i) rows[r * s.kp + i] = bf16_at(src, i);
      }
      for (int64_t kb = 0; kb < kb_total; ++kb) {
        for (int half = 0; half < 2; ++half) {
          const uint16_t* group[16];
          for (int i = 0; i < 16; ++i) group[i] = rows.data() + (half * 16 + i) * s.kp + kb * 32;
          detail::amx_pack_k_group(group, 32, dst + (nb * kb_total + kb) * 512 + half * 256);
        }
      }
    }
  }
}

AmxLinear::AmxLinear(const float* w, int64_t n, int64_t k) {
  pack(w, n, k);
}
AmxLinear::AmxLinear(const uint16_t* w_bf16, int64_t n, int64_t k) {
  pack(w_bf16, n, k);
}

AmxLinear::~AmxLinear() = default;
AmxLinear::AmxLinear(AmxLinear&&) noexcept = default;
AmxLinear& AmxLinear::operator=(AmxLinear&&) noexcept = default;

uint16_t* AmxLinear::input(int64_t m) {
  PAGODA_REQUIRE(m >= 0, kInvalidArgument, "amx linear: m {} < 0", m);
  const Impl& s = *impl_;
  Workspace& ws = workspace();
  const auto need = static_cast<size_t>(padded_rows(m) * s.lda);
  if (need > ws.a_elems) {
    ws.a = aligned_zeroed<uint16_t>(need);
    ws.a_elems = need;
  }
  // Another matrix's rows may have left values in this one's padding columns [k, kp), which the
  // tile loads read (against zero weights, but NaN · 0 is NaN). Rows past m only reach output
  // rows past m, which are never stored.
  if (s.kp > s.k)
    for (int64_t r = 0; r < m; ++r)
      std::memset(ws.a.get() + r * s.lda + s.k, 0, static_cast<size_t>(s.kp - s.k) * 2);
  ws.owner = this;
  ws.a_m = m;
  return ws.a.get();
}

int64_t AmxLinear::input_ld() const { return impl_->lda; }

void AmxLinear::forward_input(float* y, int64_t m) {
  const Workspace& ws = workspace();
  PAGODA_REQUIRE(ws.owner == this && ws.a_m == m, kInvalidArgument,
                 "amx linear: forward_input for {} rows without this matrix's input({}) just "
                 "before it",
                 m, m);
  if (m > 0) impl_->run(y, m);
}

void AmxLinear::forward(const float* x, float* y, int64_t m) {
  if (m == 0) return;
  uint16_t* a = input(m);
  const Impl& s = *impl_;
#if PAGODA_AMX_LINEAR_X86
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) round_row_bf16(x + r * s.k, a + r * s.lda, s.k);
#endif
  s.run(y, m);
}

int64_t AmxLinear::n() const { return impl_->n; }
int64_t AmxLinear::k() const { return impl_->k; }
size_t AmxLinear::weight_bytes() const {
  return static_cast<size_t>(impl_->np * impl_->kp) * sizeof(uint16_t);
}

}  // namespace pagoda::kernels::cpu
