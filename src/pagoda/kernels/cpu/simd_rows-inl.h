// Per-target SIMD building blocks of the CPU attention kernels: row conversion (bf16/f16/f32/fp8
// -> f32), q·k dot products for several keys at once, softmax block update and P·V accumulation.
// Included once per Highway target from paged_attention.cpp (inside HWY_NAMESPACE); no include
// guard on purpose (Highway's per-target re-inclusion idiom).

#if defined(PAGODA_KERNELS_CPU_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_KERNELS_CPU_SIMD_ROWS_INL_H_
#undef PAGODA_KERNELS_CPU_SIMD_ROWS_INL_H_
#else
#define PAGODA_KERNELS_CPU_SIMD_ROWS_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "pagoda/core/dtype.h"
#include "pagoda/core/float_convert.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::kernels::cpu {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

/// dst[0, n) = src[0, n) converted to f32; dst[n, npad) = 0. npad is a multiple of 16.
HWY_INLINE void ConvertRow(DType t, const void* HWY_RESTRICT src, int n, int npad,
                           float* HWY_RESTRICT dst) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int i = 0;
  switch (t) {
    case DType::kF32: {
      const auto* s = static_cast<const float*>(src);
      for (; i + N <= n; i += N) hn::StoreU(hn::LoadU(d, s + i), d, dst + i);
      break;
    }
    case DType::kBF16: {
      const hn::Rebind<hwy::bfloat16_t, DF> db;
      const auto* s = static_cast<const hwy::bfloat16_t*>(src);
      for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(db, s + i)), d, dst + i);
      break;
    }
    case DType::kF16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto* s = static_cast<const hwy::float16_t*>(src);
      for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, s + i)), d, dst + i);
      break;
    }
    case DType::kFp8E4M3: {
      // e4m3fn: move exponent+mantissa into the f32 fields and re-bias by 2^(127-7); exact for
      // normals and subnormals. 0x7F / 0xFF are NaN; there are no infinities.
      const hn::Rebind<uint8_t, DF> d8;
      const DI di;
      const auto* s = static_cast<const uint8_t*>(src);
      for (; i + N <= n; i += N) {
        const auto u = hn::PromoteTo(di, hn::LoadU(d8, s + i));
        const auto mag = hn::And(u, hn::Set(di, 0x7F));
        const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(di, 0x80)));
        auto f = hn::Mul(hn::BitCast(d, hn::ShiftLeft<20>(mag)), hn::Set(d, 0x1p120f));
        f = hn::IfThenElse(hn::RebindMask(d, hn::Eq(mag, hn::Set(di, 0x7F))),
                           hn::Set(d, std::numeric_limits<float>::quiet_NaN()), f);
        hn::StoreU(hn::Or(f, hn::BitCast(d, sign)), d, dst + i);
      }
      break;
    }
    case DType::kFp8E5M2: {
      // e5m2: same trick with 2^(127-15); exponent 31 maps to inf / NaN.
      const hn::Rebind<uint8_t, DF> d8;
      const DI di;
      const auto* s = static_cast<const uint8_t*>(src);
      for (; i + N <= n; i += N) {
        const auto u = hn::PromoteTo(di, hn::LoadU(d8, s + i));
        const auto mag = hn::And(u, hn::Set(di, 0x7F));
        const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(di, 0x80)));
        auto f = hn::Mul(hn::BitCast(d, hn::ShiftLeft<21>(mag)), hn::Set(d, 0x1p112f));
        const auto special = hn::Or(hn::Set(di, 0x7F800000),
                                    hn::ShiftLeft<21>(hn::And(mag, hn::Set(di, 3))));
        f = hn::IfThenElse(hn::RebindMask(d, hn::Gt(mag, hn::Set(di, 0x7B))),
                           hn::BitCast(d, special), f);
        hn::StoreU(hn::Or(f, hn::BitCast(d, sign)), d, dst + i);
      }
      break;
    }
    default:
      break;
  }
  for (; i < n; ++i) dst[i] = read_as_f32(src, t, static_cast<size_t>(i));
  for (; i < npad; ++i) dst[i] = 0.f;
}

/// s[j] = q0·k_j (and t[j] = q1·k_j when q1) for j in [0, n); keys are rows of kf with leading
/// dimension ld; all rows are zero-padded to dpad floats.
HWY_INLINE void DotKeys(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1,
                        const float* HWY_RESTRICT kf, int ld, int n, int dpad,
                        float* HWY_RESTRICT s0, float* HWY_RESTRICT s1) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int j = 0;
  if (q1 != nullptr) {
    for (; j + 4 <= n; j += 4) {
      const float* k0 = kf + static_cast<int64_t>(j) * ld;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      VF b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
      for (int x = 0; x < dpad; x += N) {
        const VF qa = hn::LoadU(d, q0 + x);
        const VF qb = hn::LoadU(d, q1 + x);
        const VF k0v = hn::LoadU(d, k0 + x);
        const VF k1v = hn::LoadU(d, k0 + ld + x);
        const VF k2v = hn::LoadU(d, k0 + 2 * ld + x);
        const VF k3v = hn::LoadU(d, k0 + 3 * ld + x);
        a0 = hn::MulAdd(qa, k0v, a0);
        a1 = hn::MulAdd(qa, k1v, a1);
        a2 = hn::MulAdd(qa, k2v, a2);
        a3 = hn::MulAdd(qa, k3v, a3);
        b0 = hn::MulAdd(qb, k0v, b0);
        b1 = hn::MulAdd(qb, k1v, b1);
        b2 = hn::MulAdd(qb, k2v, b2);
        b3 = hn::MulAdd(qb, k3v, b3);
      }
      s0[j] = hn::GetLane(hn::SumOfLanes(d, a0));
      s0[j + 1] = hn::GetLane(hn::SumOfLanes(d, a1));
      s0[j + 2] = hn::GetLane(hn::SumOfLanes(d, a2));
      s0[j + 3] = hn::GetLane(hn::SumOfLanes(d, a3));
      s1[j] = hn::GetLane(hn::SumOfLanes(d, b0));
      s1[j + 1] = hn::GetLane(hn::SumOfLanes(d, b1));
      s1[j + 2] = hn::GetLane(hn::SumOfLanes(d, b2));
      s1[j + 3] = hn::GetLane(hn::SumOfLanes(d, b3));
    }
  } else {
    for (; j + 4 <= n; j += 4) {
      const float* k0 = kf + static_cast<int64_t>(j) * ld;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      for (int x = 0; x < dpad; x += N) {
        const VF qa = hn::LoadU(d, q0 + x);
        a0 = hn::MulAdd(qa, hn::LoadU(d, k0 + x), a0);
        a1 = hn::MulAdd(qa, hn::LoadU(d, k0 + ld + x), a1);
        a2 = hn::MulAdd(qa, hn::LoadU(d, k0 + 2 * ld + x), a2);
        a3 = hn::MulAdd(qa, hn::LoadU(d, k0 + 3 * ld + x), a3);
      }
      s0[j] = hn::GetLane(hn::SumOfLanes(d, a0));
      s0[j + 1] = hn::GetLane(hn::SumOfLanes(d, a1));
      s0[j + 2] = hn::GetLane(hn::SumOfLanes(d, a2));
      s0[j + 3] = hn::GetLane(hn::SumOfLanes(d, a3));
    }
  }
  for (; j < n; ++j) {
    const float* k0 = kf + static_cast<int64_t>(j) * ld;
    VF a0 = hn::Zero(d), b0 = hn::Zero(d);
    for (int x = 0; x < dpad; x += N) {
      const VF kv = hn::LoadU(d, k0 + x);
      a0 = hn::MulAdd(hn::LoadU(d, q0 + x), kv, a0);
      if (q1 != nullptr) b0 = hn::MulAdd(hn::LoadU(d, q1 + x), kv, b0);
    }
    s0[j] = hn::GetLane(hn::SumOfLanes(d, a0));
    if (q1 != nullptr) s1[j] = hn::GetLane(hn::SumOfLanes(d, b0));
  }
}

/// out[k] = sum of the lanes of a_k, k = 0..3 (one shuffle tree for all four).
HWY_INLINE void Reduce4(VF a0, VF a1, VF a2, VF a3, float* HWY_RESTRICT out) {
  const DF d;
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  out[0] = hn::GetLane(hn::SumOfLanes(d, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(d, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(d, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(d, a3));
#else
  const hn::Repartition<double, DF> dd;
  const VF s01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const VF s23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(dd, s01);
  const auto w23 = hn::BitCast(dd, s23);
  const VF s = hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, w01, w23)),
                       hn::BitCast(d, hn::InterleaveUpper(dd, w01, w23)));
#if HWY_TARGET <= HWY_AVX3
  // Lanes 4b..4b+3 of s hold block b's partial sums: add the four 128-bit blocks in registers.
  const __m512 t = _mm512_add_ps(s.raw, _mm512_shuffle_f32x4(s.raw, s.raw, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  _mm_storeu_ps(out, _mm512_castps512_ps128(u));
  return;
#elif HWY_TARGET == HWY_AVX2
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s.raw), _mm256_extractf128_ps(s.raw, 1));
  _mm_storeu_ps(out, t);
  return;
#endif
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(s, d, buf);
  const size_t n = hn::Lanes(d);
  for (int k = 0; k < 4; ++k) {
    float t = buf[k];
    for (size_t blk = 4; blk < n; blk += 4) t += buf[blk + k];
    out[k] = t;
  }
#endif
}

/// Scores of four query rows q[0..3] (rows of qf, leading dimension ld) against keys [0, n) of
/// kf: s + r * ls holds row r's scores. Four keys at a time, 16 accumulators.
HWY_INLINE void DotKeys4(const float* HWY_RESTRICT qf, const float* HWY_RESTRICT kf, int ld,
                         int n, int dpad, float* HWY_RESTRICT s, int ls) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const float* q0 = qf;
  const float* q1 = qf + ld;
  const float* q2 = qf + 2 * ld;
  const float* q3 = qf + 3 * ld;
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* k0 = kf + static_cast<int64_t>(j) * ld;
    VF a00 = hn::Zero(d), a01 = hn::Zero(d), a02 = hn::Zero(d), a03 = hn::Zero(d);
    VF a10 = hn::Zero(d), a11 = hn::Zero(d), a12 = hn::Zero(d), a13 = hn::Zero(d);
    VF a20 = hn::Zero(d), a21 = hn::Zero(d), a22 = hn::Zero(d), a23 = hn::Zero(d);
    VF a30 = hn::Zero(d), a31 = hn::Zero(d), a32 = hn::Zero(d), a33 = hn::Zero(d);
    for (int x = 0; x < dpad; x += N) {
      const VF k0v = hn::LoadU(d, k0 + x);
      const VF k1v = hn::LoadU(d, k0 + ld + x);
      const VF k2v = hn::LoadU(d, k0 + 2 * ld + x);
      const VF k3v = hn::LoadU(d, k0 + 3 * ld + x);
      VF qv = hn::LoadU(d, q0 + x);
      a00 = hn::MulAdd(qv, k0v, a00);
      a01 = hn::MulAdd(qv, k1v, a01);
      a02 = hn::MulAdd(qv, k2v, a02);
      a03 = hn::MulAdd(qv, k3v, a03);
      qv = hn::LoadU(d, q1 + x);
      a10 = hn::MulAdd(qv, k0v, a10);
      a11 = hn::MulAdd(qv, k1v, a11);
      a12 = hn::MulAdd(qv, k2v, a12);
      a13 = hn::MulAdd(qv, k3v, a13);
      qv = hn::LoadU(d, q2 + x);
      a20 = hn::MulAdd(qv, k0v, a20);
      a21 = hn::MulAdd(qv, k1v, a21);
      a22 = hn::MulAdd(qv, k2v, a22);
      a23 = hn::MulAdd(qv, k3v, a23);
      qv = hn::LoadU(d, q3 + x);
      a30 = hn::MulAdd(qv, k0v, a30);
      a31 = hn::MulAdd(qv, k1v, a31);
      a32 = hn::MulAdd(qv, k2v, a32);
      a33 = hn::MulAdd(qv, k3v, a33);
    }
    Reduce4(a00, a01, a02, a03, s + j);
    Reduce4(a10, a11, a12, a13, s + ls + j);
    Reduce4(a20, a21, a22, a23, s + 2 * ls + j);
    Reduce4(a30, a31, a32, a33, s + 3 * ls + j);
  }
  if (j < n) {
    DotKeys(q0, q1, kf + static_cast<int64_t>(j) * ld, ld, n - j, dpad, s + j, s + ls + j);
    DotKeys(q2, q3, kf + static_cast<int64_t>(j) * ld, ld, n - j, dpad, s + 2 * ls + j,
            s + 3 * ls + j);
  }
}

/// acc_r[0, dpad) += Σ_j p_r[j] * vf[j, 0:dpad) for R rows at once (each V vector loaded once
/// for all R rows). p_r = p + r * lp, acc_r = acc + r * la.
template <int R>
HWY_INLINE void AccumulatePVRows(const float* HWY_RESTRICT p, int lp, int n,
                                 const float* HWY_RESTRICT vf, int ld, int dpad,
                                 float* HWY_RESTRICT acc, int la) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int x = 0; x < dpad; x += 2 * N) {
    const bool two = x + N < dpad;
    VF a[R][2];
    for (int r = 0; r < R; ++r) {
      a[r][0] = hn::LoadU(d, acc + r * la + x);
      a[r][1] = two ? hn::LoadU(d, acc + r * la + x + N) : hn::Zero(d);
    }
    const float* v = vf + x;
    for (int j = 0; j < n; ++j, v += ld) {
      const VF v0 = hn::LoadU(d, v);
      const VF v1 = two ? hn::LoadU(d, v + N) : hn::Zero(d);
      for (int r = 0; r < R; ++r) {
        const VF pj = hn::Set(d, p[r * lp + j]);
        a[r][0] = hn::MulAdd(pj, v0, a[r][0]);
        a[r][1] = hn::MulAdd(pj, v1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      hn::StoreU(a[r][0], d, acc + r * la + x);
      if (two) hn::StoreU(a[r][1], d, acc + r * la + x + N);
    }
  }
}

/// Key-visibility of one query row inside a block of keys [t0, t0 + n).
struct RowMask {
  int lo = 0;                        ///< first visible key (window / chunk start)
  int hi = 0;                        ///< one past the last visible key (causal / chunk end)
  const uint8_t* bits = nullptr;     ///< custom mask bits of this row (bit j = key j), or null
  int64_t bit_base = 0;              ///< bit offset of key 0 of this row
};

/// Turns the raw scores s[0, n) of one row (padded to npad) into probabilities with the online
/// softmax: applies the soft cap, masks, updates running max m and sum l, rescales acc[0, dpad)
/// when the max grows, and leaves p in s (0 for masked keys). Returns false when no key of the
/// block is visible to the row (s is then all zero).
HWY_INLINE bool SoftmaxBlock(float* HWY_RESTRICT s, int n, int npad, int t0, const RowMask& rm,
                             float cap, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                             float* HWY_RESTRICT acc, int dpad) {
  const DF d;
  const DI di;
  const int N = static_cast<int>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int lo = rm.lo - t0;
  const int hi = (rm.hi < t0 + n ? rm.hi : t0 + n) - t0;
  if (hi <= lo || hi <= 0) {
    for (int j = 0; j < npad; ++j) s[j] = 0.f;
    return false;
  }
  const VF vinf = hn::Set(d, neg_inf);
  const VF vcap = hn::Set(d, cap);
  VF vmax = vinf;
  for (int j = 0; j < npad; j += N) {
    VF v = hn::LoadU(d, s + j);
    if (cap > 0.f) v = hn::Mul(vcap, hn::Tanh(d, v));
    const auto idx = hn::Iota(di, j);
    const auto vis = hn::And(hn::Gt(idx, hn::Set(di, lo - 1)), hn::Lt(idx, hn::Set(di, hi)));
    v = hn::IfThenElse(hn::RebindMask(d, vis), v, vinf);
    hn::StoreU(v, d, s + j);
    vmax = hn::Max(vmax, v);
  }
  if (rm.bits != nullptr) {
    for (int j = lo < 0 ? 0 : lo; j < hi; ++j) {
      const int64_t bit = rm.bit_base + t0 + j;
      if (((rm.bits[bit >> 3] >> (bit & 7)) & 1) == 0) s[j] = neg_inf;
    }
    vmax = vinf;
    for (int j = 0; j < npad; j += N) vmax = hn::Max(vmax, hn::LoadU(d, s + j));
  }
  const float bmax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (bmax == neg_inf) {
    for (int j = 0; j < npad; ++j) s[j] = 0.f;
    return false;
  }
  const float m_new = *m > bmax ? *m : bmax;
  const VF vm = hn::Set(d, m_new);
  VF vsum = hn::Zero(d);
  for (int j = 0; j < npad; j += N) {
    const VF p = hn::Exp(d, hn::Sub(hn::LoadU(d, s + j), vm));
    hn::StoreU(p, d, s + j);
    vsum = hn::Add(vsum, p);
  }
  const float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  if (m_new != *m) {
    const float alpha = std::exp(*m - m_new);  // 0 when m was -inf
    *l *= alpha;
    const VF va = hn::Set(d, alpha);
    for (int x = 0; x < dpad; x += N) hn::StoreU(hn::Mul(va, hn::LoadU(d, acc + x)), d, acc + x);
    *m = m_new;
  }
  *l += sum;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Direct bf16 kernels (no f32 scratch copy of K/V). A u32 load of 2N bf16 values splits into two
// f32 vectors with one shift (even elements) and one AND (odd elements). Dot products do not care
// about element order, so q rows and output accumulators are kept in the same "pair-split" order:
// within every chunk of 2N elements, f32 slots [0, N) hold the even elements and [N, 2N) the odd
// ones. Requires the head dims to be multiples of 2N (PairChunk()).

/// Elements covered by one u32 load of bf16 pairs (2 x lanes of f32).
HWY_INLINE int PairChunk() { return 2 * static_cast<int>(hn::Lanes(DF())); }

/// Reorders row[0, n) (n a multiple of PairChunk()) from natural into pair-split order
/// (inverse = false) or back (inverse = true); tmp holds n floats.
HWY_INLINE void PairSplitRow(float* HWY_RESTRICT row, int n, bool inverse,
                             float* HWY_RESTRICT tmp) {
  const int N = PairChunk() / 2;
  for (int i = 0; i < n; ++i) tmp[i] = row[i];
  for (int c = 0; c < n; c += 2 * N) {
    for (int i = 0; i < N; ++i) {
      if (inverse) {
        row[c + 2 * i] = tmp[c + i];
        row[c + 2 * i + 1] = tmp[c + N + i];
      } else {
        row[c + i] = tmp[c + 2 * i];
        row[c + N + i] = tmp[c + 2 * i + 1];
      }
    }
  }
}

/// f32 views of the even (lo) and odd (hi) bf16 elements of one u32 load.
HWY_INLINE void SplitBf16Pairs(const void* HWY_RESTRICT src, VF& lo, VF& hi) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::LoadU(du, static_cast<const uint32_t*>(src));
  lo = hn::BitCast(d, hn::ShiftLeft<16>(u));
  hi = hn::BitCast(d, hn::And(u, hn::Set(du, 0xFFFF0000u)));
}

/// s[r * ls + j] = q_r · k_j for R query rows (pair-split order, rows of q with leading dimension
/// ldq) and keys j in [0, n), where key j is the bf16 row kp[j] + off; dim is a multiple of
/// PairChunk().
/// Each K vector is loaded and converted once for all R rows; four keys share one reduction.
template <int R>
HWY_INLINE void ScoresBf16(const float* HWY_RESTRICT q, int ldq,
                           const hwy::bfloat16_t* const* HWY_RESTRICT kp, int64_t off, int n,
                           int dim, float* HWY_RESTRICT s, int ls) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    VF a[R][4];
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < 4; ++k) a[r][k] = hn::Zero(d);
    for (int c = 0; c < dim; c += 2 * N) {
      VF klo[4], khi[4];
      for (int k = 0; k < 4; ++k) SplitBf16Pairs(kp[j + k] + off + c, klo[k], khi[k]);
      for (int r = 0; r < R; ++r) {
        const VF qlo = hn::LoadU(d, q + r * ldq + c);
        const VF qhi = hn::LoadU(d, q + r * ldq + c + N);
        for (int k = 0; k < 4; ++k) {
          a[r][k] = hn::MulAdd(qlo, klo[k], a[r][k]);
          a[r][k] = hn::MulAdd(qhi, khi[k], a[r][k]);
        }
      }
    }
    for (int r = 0; r < R; ++r) Reduce4(a[r][0], a[r][1], a[r][2], a[r][3], s + r * ls + j);
  }
  for (; j < n; ++j) {
    VF a[R];
    for (int r = 0; r < R; ++r) a[r] = hn::Zero(d);
    for (int c = 0; c < dim; c += 2 * N) {
      VF klo, khi;
      SplitBf16Pairs(kp[j] + off + c, klo, khi);
      for (int r = 0; r < R; ++r) {
        a[r] = hn::MulAdd(hn::LoadU(d, q + r * ldq + c), klo, a[r]);
        a[r] = hn::MulAdd(hn::LoadU(d, q + r * ldq + c + N), khi, a[r]);
      }
    }
    for (int r = 0; r < R; ++r) s[r * ls + j] = hn::GetLane(hn::SumOfLanes(d, a[r]));
  }
}

/// acc_r[0, dim) += Σ_j p_r[j] · v_j for R rows (acc in pair-split order, p_r = p + r * lp,
/// acc_r = acc + r * la), keys j in [0, n) with bf16 rows vp[j] + off; dim a multiple of
/// PairChunk().
/// Two u32 loads (4 f32 vectors) per key and pass; each V vector feeds all R rows.
template <int R>
HWY_INLINE void AccumulatePVBf16(const float* HWY_RESTRICT p, int lp, int n,
                                 const hwy::bfloat16_t* const* HWY_RESTRICT vp, int64_t off,
                                 int dim, float* HWY_RESTRICT acc, int la) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int c = 0; c < dim; c += 4 * N) {
    const bool two = c + 2 * N < dim;
    VF a[R][4];
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 4; ++k) {
        a[r][k] = (k < 2 || two) ? hn::LoadU(d, acc + r * la + c + k * N) : hn::Zero(d);
      }
    }
    for (int j = 0; j < n; ++j) {
      VF v[4];
      SplitBf16Pairs(vp[j] + off + c, v[0], v[1]);
      if (two) {
        SplitBf16Pairs(vp[j] + off + c + 2 * N, v[2], v[3]);
      } else {
        v[2] = v[3] = hn::Zero(d);
      }
      for (int r = 0; r < R; ++r) {
        const VF pj = hn::Set(d, p[r * lp + j]);
        for (int k = 0; k < 4; ++k) a[r][k] = hn::MulAdd(pj, v[k], a[r][k]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < (two ? 4 : 2); ++k) hn::StoreU(a[r][k], d, acc + r * la + c + k * N);
    }
  }
}

/// row[0, npad) *= scale (in place).
HWY_INLINE void ScaleRow(float* HWY_RESTRICT row, float scale, int npad) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vs = hn::Set(d, scale);
  for (int x = 0; x < npad; x += N) hn::StoreU(hn::Mul(vs, hn::LoadU(d, row + x)), d, row + x);
}

}  // namespace HWY_NAMESPACE
}  // namespace pagoda::kernels::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
