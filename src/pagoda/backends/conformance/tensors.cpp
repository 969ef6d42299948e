#include "pagoda/backends/conformance/tensors.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::backends::conformance {

HostTensor::HostTensor(std::vector<int64_t> s, DType t) : dtype(t), shape(std::move(s)) {
  bytes.assign(static_cast<size_t>(numel()) * dtype_size(dtype), 0);
}

int64_t HostTensor::numel() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float HostTensor::get(int64_t i) const { return read_as_f32(bytes.data(), dtype, static_cast<size_t>(i)); }
void HostTensor::set(int64_t i, float v) {
  write_from_f32(bytes.data(), dtype, static_cast<size_t>(i), v);
}

TensorView HostTensor::view() const {
  return view_at(const_cast<uint8_t*>(bytes.data()), Device::cpu());
}

TensorView HostTensor::view_at(void* p, Device device) const {
  switch (shape.size()) {
    case 0: return TensorView();
    case 2: return TensorView(p, dtype, {shape[0], shape[1]}, device);
    case 3: return TensorView(p, dtype, {shape[0], shape[1], shape[2]}, device);
    case 4: return TensorView(p, dtype, {shape[0], shape[1], shape[2], shape[3]}, device);
    default: throw_error(ErrorCode::kInvalidArgument, "HostTensor rank {}", shape.size());
  }
}

DeviceTensor to_device(const HostTensor& t, platform::Allocator& allocator) {
  DeviceTensor d;
  if (t.shape.empty()) return d;
  d.buffer = platform::make_buffer(allocator, std::max<size_t>(t.bytes.size(), 16));
  allocator.copy_to_device(d.buffer.get(), t.bytes.data(), t.bytes.size());
  d.view = t.view_at(d.buffer.get(), allocator.device());
  return d;
}

void copy_back(const DeviceTensor& d, HostTensor& t, platform::Allocator& allocator) {
  if (t.shape.empty()) return;
  PAGODA_REQUIRE(d.buffer != nullptr && d.view.numel() == t.numel() && d.view.dtype() == t.dtype,
                 kInvalidArgument, "copy_back: device tensor {} does not match the host tensor",
                 d.view.describe());
  allocator.copy_to_host(t.bytes.data(), d.buffer.get(), t.bytes.size());
}

float round_to(DType dtype, float x) {
  uint8_t buf[8];
  write_from_f32(buf, dtype, 0, x);
  return read_as_f32(buf, dtype, 0);
}

HostTensor random_tensor(std::vector<int64_t> shape, DType dtype, std::mt19937_64& rng) {
  HostTensor t(std::move(shape), dtype);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

HostTensor filled_tensor(std::vector<int64_t> shape, DType dtype, float value) {
  HostTensor t(std::move(shape), dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
  return t;
}

HostTensor gather_rows(const std::vector<float>& store, int row, const std::vector<int>& toks,
                       DType dtype, int heads) {
  HostTensor t({static_cast<int64_t>(toks.size()), heads, row / heads}, dtype);
  for (size_t i = 0; i < toks.size(); ++i) {
    for (int e = 0; e < row; ++e) {
      t.set(static_cast<int64_t>(i) * row + e, store[static_cast<size_t>(toks[i]) * row + e]);
    }
  }
  return t;
}

CaseResult compare(const HostTensor& out, const HostTensor* lse, const Expected& expected,
                   double atol, double rtol) {
  const int64_t heads = out.shape[1], dim = out.shape[2];
  int64_t bad = 0;
  double worst = 0;
  std::string first;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double a = out.get(i), e = expected.out.get(i);
    const double err = std::fabs(a - e);
    const bool ok = std::isfinite(a) && err <= atol + rtol * std::fabs(e);
    if (std::isfinite(a)) worst = std::max(worst, err);
    if (ok) continue;
    if (bad++ == 0) {
      first = fmt::format("out[token {}, head {}, dim {}] = {} expected {}{}", i / (heads * dim),
                          (i / dim) % heads, i % dim, a, e,
                          std::isnan(a) ? " (NaN: not written or poisoned KV read)" : "");
    }
  }
  if (bad) {
    return {Verdict::kFail, fmt::format("{} of {} outputs wrong (max |err| {:.3g}); first: {}", bad,
                                        out.numel(), worst, first)};
  }
  double lse_ratio = 0;  // worst |err| / tolerance
  if (lse != nullptr) {
    for (int64_t i = 0; i < lse->numel(); ++i) {
      const double a = lse->get(i), e = expected.lse.get(i);
      const double tol = expected.lse_tol[static_cast<size_t>(i)];
      const bool ok = std::isinf(e) ? a == e : std::fabs(a - e) <= tol;
      if (ok && !std::isinf(e)) lse_ratio = std::max(lse_ratio, std::fabs(a - e) / tol);
      if (!ok) {
        return {Verdict::kFail, fmt::format("lse[token {}, head {}] = {} expected {} (|err| {:.3g} > "
                                            "tolerance {:.3g})",
                                            i / lse->shape[1], i % lse->shape[1], a, e,
                                            std::fabs(a - e), tol)};
      }
    }
  }
  return {Verdict::kPass, lse != nullptr ? fmt::format("max |err| {:.3g}, lse |err| / tol {:.2f}",
                                                       worst, lse_ratio)
                                          : fmt::format("max |err| {:.3g}", worst)};
}

}  // namespace pagoda::backends::conformance
