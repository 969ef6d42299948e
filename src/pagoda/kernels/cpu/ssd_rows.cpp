// The Mamba2 layer's elementwise rows (see ssd_rows.h), compiled once per Highway target and
// dispatched at run time.
#include "pagoda/kernels/cpu/ssd_rows.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "pagoda/kernels/cpu/ssd_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pagoda::kernels::cpu {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using MF = hn::Mask<DF>;

/// The lanes of `m` at p (all when `full`), the others 0.
HWY_INLINE VF Load(MF m, bool full, const float* HWY_RESTRICT p) {
  const DF d;
  return full ? hn::LoadU(d, p) : hn::MaskedLoad(m, d, p);
}

/// Stores the lanes of `m` (all when `full`).
HWY_INLINE void Store(VF v, MF m, bool full, float* HWY_RESTRICT p) {
  const DF d;
  if (full)
    hn::StoreU(v, d, p);
  else
    hn::BlendedStore(v, m, d, p);
}

/// v·σ(v) with e = exp(-|v|) in (0, 1]: v / (1 + e) for v >= 0, v·e / (1 + e) below (no overflow).
HWY_INLINE VF Silu(VF v) {
  const DF d;
  const VF e = hn::Exp(d, hn::Neg(hn::Abs(v)));
  const VF num = hn::IfThenElse(hn::Lt(v, hn::Zero(d)), hn::Mul(v, e), v);
  return hn::Div(num, hn::Add(hn::Set(d, 1.f), e));
}

void ConvSiluRowImpl(const float* const* in, const float* HWY_RESTRICT taps,
                     const float* HWY_RESTRICT bias, int k, int64_t n, float* HWY_RESTRICT out) {
  const DF d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t c = 0; c < n; c += lanes) {
    const bool full = c + lanes <= n;
    const MF m = hn::FirstN(d, static_cast<size_t>(n - c));
    VF acc = bias != nullptr ? Load(m, full, bias + c) : hn::Zero(d);
    for (int j = 0; j < k; ++j)
      acc = hn::MulAdd(Load(m, full, taps + j * n + c), Load(m, full, in[j] + c), acc);
    Store(Silu(acc), m, full, out + c);
  }
}

void SsdTimeStepsImpl(const float* HWY_RESTRICT raw, const float* HWY_RESTRICT bias,
                      const float* HWY_RESTRICT a, int64_t n, float dt_min, float dt_max,
                      float* HWY_RESTRICT delta, float* HWY_RESTRICT decay) {
  const DF d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t h = 0; h < n; h += lanes) {
    const bool full = h + lanes <= n;
    const MF m = hn::FirstN(d, static_cast<size_t>(n - h));
    const VF v = hn::Add(Load(m, full, raw + h), Load(m, full, bias + h));
    const MF linear = hn::Gt(v, hn::Set(d, 20.f));
    // exp(min(v, 20)) keeps the unused lanes of the linear branch finite.
    const VF sp =
        hn::IfThenElse(linear, v, hn::Log1p(d, hn::Exp(d, hn::Min(v, hn::Set(d, 20.f)))));
    const VF dt = hn::Min(hn::Max(sp, hn::Set(d, dt_min)), hn::Set(d, dt_max));
    Store(dt, m, full, delta + h);
    Store(hn::Exp(d, hn::Mul(dt, Load(m, full, a + h))), m, full, decay + h);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pagoda::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::kernels::cpu {

HWY_EXPORT(ConvSiluRowImpl);
HWY_EXPORT(SsdTimeStepsImpl);

void conv_silu_row(const float* const* in, const float* taps, const float* bias, int k, int64_t n,
                   float* out) {
  HWY_DYNAMIC_DISPATCH(ConvSiluRowImpl)(in, taps, bias, k, n, out);
}

void ssd_time_steps(const float* raw, const float* bias, const float* a, int64_t n, float dt_min,
                    float dt_max, float* delta, float* decay) {
  HWY_DYNAMIC_DISPATCH(SsdTimeStepsImpl)(raw, bias, a, n, dt_min, dt_max, delta, decay);
}

}  // namespace pagoda::kernels::cpu
#endif  // HWY_ONCE
