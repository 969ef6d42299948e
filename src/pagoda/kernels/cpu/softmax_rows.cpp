// Row-major online softmax of the amx backend's extend (see softmax_rows.h), compiled once per
// Highway target and dispatched at run time.
#include "pagoda/kernels/cpu/softmax_rows.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "pagoda/core/float_convert.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "pagoda/kernels/cpu/softmax_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagoda::kernels::cpu {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

/// bf16 bits (round to nearest even) of the lanes of v, in the low half of u32 lanes. NaN lanes
/// stay NaN unless their payload is all ones near the top (no arithmetic here makes those).
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Bf16Bits(VF v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::BitCast(di, hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb))));
}

/// Stores the lanes of v at dst: f32 (kBf16 false) or bf16 bits (Bf16Bits).
template <bool kBf16>
HWY_INLINE void StoreAs(VF v, void* HWY_RESTRICT dst) {
  const DF d;
  if constexpr (!kBf16) {
    hn::StoreU(v, d, static_cast<float*>(dst));
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    hn::StoreU(hn::DemoteTo(d16, Bf16Bits(v)), d16, static_cast<uint16_t*>(dst));
  }
}

/// 2^t for t <= 127, 0 below -126 (-inf included): 2^n · 2^f with n = round(t) and 2^f, f in
/// [-1/2, 1/2], Cephes' exp2f polynomial (relative error about 2e-7). NaN stays NaN.
HWY_INLINE VF Exp2(VF t) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const auto under = hn::Lt(t, hn::Set(d, -126.f));
  t = hn::Max(hn::Set(d, -126.f), t);
  const auto n = hn::NearestInt(t);
  const VF f = hn::Sub(t, hn::ConvertTo(d, n));
  VF y = hn::Set(d, 1.535336188319500e-4f);
  y = hn::MulAdd(y, f, hn::Set(d, 1.339887440266574e-3f));
  y = hn::MulAdd(y, f, hn::Set(d, 9.618437357674640e-3f));
  y = hn::MulAdd(y, f, hn::Set(d, 5.550332471162809e-2f));
  y = hn::MulAdd(y, f, hn::Set(d, 2.402264791363012e-1f));
  y = hn::MulAdd(y, f, hn::Set(d, 6.931472028550421e-1f));
  y = hn::MulAdd(y, f, hn::Set(d, 1.f));
  return hn::IfThenZeroElse(under,
                            hn::BitCast(d, hn::Add(hn::BitCast(di, y), hn::ShiftLeft<23>(n))));
}

/// Stores the lanes of v rounded to bf16 at dst: as bf16 bits (kBf16) or as the rounded f32
/// values (the operands of a f32 matmul: the same exact products as bf16 ones).
template <bool kBf16>
HWY_INLINE void StoreP(VF v, void* HWY_RESTRICT dst) {
  if constexpr (kBf16) {
    StoreAs<true>(v, dst);
  } else {
    const DF d;
    StoreAs<false>(hn::BitCast(d, hn::ShiftLeft<16>(Bf16Bits(v))), dst);
  }
}

/// Element i of a row of f32 (kBf16 false) or bf16 elements.
template <bool kBf16>
HWY_INLINE void* At(void* row, int64_t i) {
  return static_cast<unsigned char*>(row) + i * (kBf16 ? 2 : 4);
}

/// row[0, n) *= f.
HWY_INLINE void ScaleInPlace(float* HWY_RESTRICT row, int n, float f) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vf = hn::Set(d, f);
  int x = 0;
  for (; x + N <= n; x += N) hn::StoreU(hn::Mul(vf, hn::LoadU(d, row + x)), d, row + x);
  for (; x < n; ++x) row[x] *= f;
}

/// max_j scale · s[j] over j < vis (vis >= 1; s readable up to vis rounded up to whole vectors).
HWY_INLINE float RowMax(const float* HWY_RESTRICT s, int vis, VF vscale) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vinf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF vmax = vinf;
  int j = 0;
  for (; j + N <= vis; j += N) vmax = hn::Max(vmax, hn::Mul(vscale, hn::LoadU(d, s + j)));
  if (j < vis)
    vmax = hn::Max(vmax, hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(vis - j)),
                                        hn::Mul(vscale, hn::LoadU(d, s + j)), vinf));
  return hn::GetLane(hn::MaxOfLanes(d, vmax));
}

/// p[j] = 2^(scale · s[j] − mx) for j < vis and 0 for j in [vis, n) (stored as kBf16 says);
/// returns Σ p (unrounded) and sets *seen to max_j scale · s[j] over j < vis.
template <bool kBf16>
HWY_INLINE float RowExp(const float* HWY_RESTRICT s, int vis, int n, VF vscale, float mx,
                        void* HWY_RESTRICT p, float* seen) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vinf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const VF vm = hn::Set(d, mx);
  VF vsum = hn::Zero(d), vmax = vinf;
  int j = 0;
  for (; j + N <= vis; j += N) {
    const VF x = hn::Mul(vscale, hn::LoadU(d, s + j));
    vmax = hn::Max(vmax, x);
    const VF e = Exp2(hn::Sub(x, vm));
    vsum = hn::Add(vsum, e);
    StoreP<kBf16>(e, At<kBf16>(p, j));
  }
  if (j < vis) {
    const auto keep = hn::FirstN(d, static_cast<size_t>(vis - j));
    const VF x = hn::IfThenElse(keep, hn::Mul(vscale, hn::LoadU(d, s + j)), vinf);
    vmax = hn::Max(vmax, x);
    const VF e = hn::IfThenElseZero(keep, Exp2(hn::Sub(x, vm)));
    vsum = hn::Add(vsum, e);
    StoreP<kBf16>(e, At<kBf16>(p, j));
    j += N;
  }
  for (; j < n; j += N) StoreP<kBf16>(hn::Zero(d), At<kBf16>(p, j));
  *seen = hn::GetLane(hn::MaxOfLanes(d, vmax));
  return hn::GetLane(hn::SumOfLanes(d, vsum));
}

template <bool kBf16>
void SoftmaxRows(const SoftmaxRowsBlock& b) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const VF vscale = hn::Set(d, b.scale * 1.44269504088896341f);  // base 2
  for (int r = 0; r < b.rows; ++r) {
    const float* HWY_RESTRICT s = b.s + static_cast<int64_t>(r) * b.n;
    void* prow = At<kBf16>(b.p, static_cast<int64_t>(r) * b.n);
    const int vis = b.visible[r];
    if (vis <= 0) {
      for (int j = 0; j < b.n; j += N) StoreP<kBf16>(hn::Zero(d), At<kBf16>(prow, j));
      continue;
    }
    const float m_old = b.m[r];
    float seen = neg_inf;
    if (m_old != neg_inf) {
      // One pass against the running max; only a block whose max passes it by more than the
      // margin is redone (below).
      const float sum = RowExp<kBf16>(s, vis, b.n, vscale, m_old, prow, &seen);
      if (!(seen > m_old + kSoftmaxLazyRescale)) {
        b.l[r] += sum;
        continue;
      }
    } else {
      seen = RowMax(s, vis, vscale);
      if (seen == neg_inf) {  // every visible score -inf: as if none were visible
        for (int j = 0; j < b.n; j += N) StoreP<kBf16>(hn::Zero(d), At<kBf16>(prow, j));
        continue;
      }
    }
    if (m_old != neg_inf) {  // a row without keys so far has l = 0 and acc = 0
      const float alpha = std::exp2(m_old - seen);
      b.l[r] *= alpha;
      ScaleInPlace(b.acc + static_cast<int64_t>(r) * b.dv, b.dv, alpha);
    }
    b.m[r] = seen;
    b.l[r] += RowExp<kBf16>(s, vis, b.n, vscale, seen, prow, &seen);
  }
}

void SoftmaxRowsBlockImpl(const SoftmaxRowsBlock& b) {
  if (b.p_dtype == DType::kBF16) {
    SoftmaxRows<true>(b);
  } else {
    SoftmaxRows<false>(b);
  }
}

void ScaleRowToImpl(const float* HWY_RESTRICT src, int n, float factor, void* HWY_RESTRICT dst,
                    DType t) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vf = hn::Set(d, factor);
  int x = 0;
  for (; x + N <= n; x += N) {
    const VF v = hn::Mul(vf, hn::LoadU(d, src + x));
    if (t == DType::kBF16) {
      // A NaN output (from a NaN input) becomes the canonical quiet NaN before rounding.
      StoreAs<true>(
          hn::IfThenElse(hn::IsNaN(v), hn::Set(d, std::numeric_limits<float>::quiet_NaN()), v),
          At<true>(dst, x));
    } else {
      StoreAs<false>(v, At<false>(dst, x));
    }
  }
  for (; x < n; ++x) write_from_f32(dst, t, static_cast<size_t>(x), src[x] * factor);
}

}  // namespace HWY_NAMESPACE
}  // namespace pagoda::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::kernels::cpu {

HWY_EXPORT(SoftmaxRowsBlockImpl);
HWY_EXPORT(ScaleRowToImpl);

void softmax_rows_block(const SoftmaxRowsBlock& b) {
  HWY_DYNAMIC_DISPATCH(SoftmaxRowsBlockImpl)(b);
}

void scale_row_to(const float* src, int n, float factor, void* dst, DType t) {
  HWY_DYNAMIC_DISPATCH(ScaleRowToImpl)(src, n, factor, dst, t);
}

}  // namespace pagoda::kernels::cpu
#endif  // HWY_ONCE
