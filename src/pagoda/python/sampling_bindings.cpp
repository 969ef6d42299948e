#include "pagoda/python/sampling_bindings.h"

#include <cmath>
#include <vector>

#include <nanobind/ndarray.h>

#include "pagoda/core/error.h"
#include "pagoda/model/host_sampling.h"

namespace nb = nanobind;

namespace pagoda::python {
namespace {

using Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Vec = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

/// out[i] = sample_row(logits[row[i]], params of i). Parameters are per output row.
void sample_rows(const Rows& logits, const Vec<int32_t>& rows, const Vec<float>& temperature,
                 const Vec<int32_t>& top_k, const Vec<float>& top_p, const Vec<float>& min_p,
                 const Vec<uint64_t>& seed, int64_t step, const Out& out) {
  const size_t n = out.shape(0);
  for (const size_t len : {rows.shape(0), temperature.shape(0), top_k.shape(0), top_p.shape(0),
                           min_p.shape(0), seed.shape(0)})
    PAGODA_REQUIRE(len == n, kInvalidArgument, "sample_rows: per-row arrays need {} entries, got {}",
                   n, len);
  const int64_t vocab = static_cast<int64_t>(logits.shape(1));
  PAGODA_REQUIRE(vocab > 0, kInvalidArgument, "sample_rows: empty vocabulary");
  for (size_t i = 0; i < n; ++i) {
    PAGODA_REQUIRE(rows.data()[i] >= 0 && static_cast<size_t>(rows.data()[i]) < logits.shape(0),
                   kOutOfRange, "sample_rows: row index {} outside [0, {})", rows.data()[i],
                   logits.shape(0));
    PAGODA_REQUIRE(top_p.data()[i] > 0.f && top_p.data()[i] <= 1.f, kInvalidArgument,
                   "sample_rows: top_p {} outside (0, 1]", top_p.data()[i]);
    PAGODA_REQUIRE(min_p.data()[i] >= 0.f && min_p.data()[i] < 1.f, kInvalidArgument,
                   "sample_rows: min_p {} outside [0, 1)", min_p.data()[i]);
    PAGODA_REQUIRE(std::isfinite(temperature.data()[i]) && temperature.data()[i] >= 0.f,
                   kInvalidArgument, "sample_rows: temperature {} must be finite and >= 0",
                   temperature.data()[i]);
  }
  nb::gil_scoped_release release;
  std::vector<int32_t> order;
  std::vector<double> probs;
  for (size_t i = 0; i < n; ++i) {
    const float* row = logits.data() + rows.data()[i] * vocab;
    const model::SampleRow p{.temperature = temperature.data()[i],
                             .top_k = top_k.data()[i],
                             .top_p = top_p.data()[i],
                             .min_p = min_p.data()[i],
                             .seed = seed.data()[i],
                             .step = step};
    out.data()[i] = model::sample_row(std::span(row, vocab), p, order, probs);
  }
}

}  // namespace

void bind_sampling(nb::module_& m) {
  m.def("sample_rows", &sample_rows, nb::arg("logits"), nb::arg("rows"), nb::arg("temperature"),
        nb::arg("top_k"), nb::arg("top_p"), nb::arg("min_p"), nb::arg("seed"), nb::arg("step"),
        nb::arg("out"),
        "pagoda's host sampler (model/host_sampling.h): out[i] (int32) drawn from logits[rows[i]]"
        " (f32 [n, vocab], C-contiguous) after temperature, top-k (<= 0: all), top-p and min-p, "
        "with the counter-based uniform of (seed[i], step). temperature 0: argmax.");
}

}  // namespace pagoda::python
