#pragma once
/// Python binding of the host sampler (model/host_sampling.h): `sample_rows`, over which
/// pagoda.flashinfer's sampling functions run for host arrays.

#include <nanobind/nanobind.h>

namespace pagoda::python {

/// Adds sample_rows() to `m`.
void bind_sampling(nanobind::module_& m);

}  // namespace pagoda::python
