// The amx extend loop's operands and products on its two paths (see amx_operands.h).
#include "pagoda/backends/amx/amx_operands.h"

#include <algorithm>
#include <cstring>

#include "pagoda/backends/amx/amx_backend.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/amx_tile.h"

namespace pagoda::backends::amx_detail {

using kernels::cpu::MatmulB;
using kernels::cpu::MatmulC;

void AmxOperand::reserve(DType t, size_t n) {
  t_ = t;
  const size_t words = (n * dtype_size(t) + 3) / 4;
  if (words_.size() < words) words_.resize(words);
}

void AmxOperand::set_row(size_t i, const uint16_t* src, int64_t n, int64_t width) {
  if (t_ == DType::kBF16) {
    std::memcpy(bytes() + 2 * i, src, static_cast<size_t>(n) * 2);
  } else {
    float* dst = reinterpret_cast<float*>(bytes()) + i;
    for (int64_t d = 0; d < n; ++d) dst[d] = bf16_bits_to_f32(src[d]);
  }
  zero(i + static_cast<size_t>(n), static_cast<size_t>(width - n));
}

void AmxOperand::zero(size_t i, size_t n) {
  std::memset(bytes() + i * dtype_size(t_), 0, n * dtype_size(t_));
}

void AmxHeadKv::begin(AmxPath path, DType t, const AmxDims& dims, int64_t kv_len) {
  path_ = path;
  dims_ = dims;
  kv_len_ = kv_len;
  padded_ = amx_round_up(kv_len, kAmxKeyAlign);
  const int64_t dq = dims.dqp, dv = dims.dvp;
  k_.reserve(t, static_cast<size_t>(padded_ * dq));
  v_.reserve(t, static_cast<size_t>(padded_ * dv));
  if (path == AmxPath::kOnednn) {
    k_.zero(static_cast<size_t>(kv_len * dq), static_cast<size_t>((padded_ - kv_len) * dq));
    v_.zero(static_cast<size_t>(kv_len * dv), static_cast<size_t>((padded_ - kv_len) * dv));
    return;
  }
  // The 16-key groups past the last one put_group fills: K groups and V pairs of every block.
  const int64_t g = amx_round_up(kv_len, 16);
  k_.zero(static_cast<size_t>(g * dq), static_cast<size_t>((padded_ - g) * dq));
  for (int64_t c = 0; c < dv / 16; ++c)
    v_.zero(static_cast<size_t>((c * padded_ + g) * 16), static_cast<size_t>((padded_ - g) * 16));
  zeros_.assign(static_cast<size_t>(std::max(dq, dv)), 0);
}

void AmxHeadKv::put_rows(int64_t j, const uint16_t* k, const uint16_t* v) {
  k_.set_row(static_cast<size_t>(j * dims_.dqp), k, dims_.dq, dims_.dqp);
  v_.set_row(static_cast<size_t>(j * dims_.dvp), v, dims_.dv, dims_.dvp);
}

void AmxHeadKv::put_group(int64_t g, const uint16_t* const* ks, const uint16_t* const* vs) {
  namespace cpu = kernels::cpu::detail;
  cpu::amx_pack_k_group(ks, static_cast<int>(dims_.dq), k_.words() + g * dims_.dq / 2);
  const int64_t ldv = padded_ / 2 * 16;
  for (int64_t i = 0; i < 16; i += 2)
    cpu::amx_pack_v_pair(vs[i], vs[i + 1], static_cast<int>(dims_.dv),
                         v_.words() + (g + i) / 2 * 16, ldv);
}

AmxProducts::AmxProducts(AmxPath path) : path_(path) {
  if (path == AmxPath::kOnednn) mm_ = std::make_unique<kernels::cpu::OnednnMatmul>();
}

DType AmxProducts::operand_dtype() const {
  return path_ == AmxPath::kTiles ? DType::kBF16 : mm_->operand_dtype();
}

void AmxProducts::scores(const AmxOperand& q, int64_t rows, const AmxHeadKv& h, int64_t j0,
                         int64_t n, float* s) {
  const int64_t dqp = h.dims_.dqp;
  if (path_ == AmxPath::kTiles) {
    kernels::cpu::detail::amx_scores(
        reinterpret_cast<const uint16_t*>(q.bytes()), static_cast<int>(rows), static_cast<int>(dqp),
        h.k_.words() + (j0 / 16) * (dqp / 2) * 16, static_cast<int>(n), s);
    return;
  }
  const size_t es = dtype_size(mm_->operand_dtype());
  mm_->run(q.bytes(), h.k_.bytes() + static_cast<size_t>(j0 * dqp) * es, s, rows, n, dqp,
           MatmulB::kRowsAreN);
}

void AmxProducts::pv(const AmxOperand& p, int64_t rows, const AmxHeadKv& h, int64_t j0, int64_t n,
                     float* acc) {
  const int64_t dvp = h.dims_.dvp;
  if (path_ == AmxPath::kTiles) {
    kernels::cpu::detail::amx_pv_accumulate(
        reinterpret_cast<const uint16_t*>(p.bytes()), static_cast<int>(rows), static_cast<int>(n),
        h.v_.words() + (j0 / 2) * 16, h.padded_ / 2 * 16, static_cast<int>(dvp), acc);
    return;
  }
  const size_t es = dtype_size(mm_->operand_dtype());
  mm_->run(p.bytes(), h.v_.bytes() + static_cast<size_t>(j0 * dvp) * es, acc, rows, dvp, n,
           MatmulB::kRowsAreK, MatmulC::kAccumulate);
}

}  // namespace pagoda::backends::amx_detail
