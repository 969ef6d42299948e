#pragma once
/// Python bindings of the kernel-level attention API: `pagoda._pagoda.BatchAttention` (plan/run
/// over a CSR page table, attention/batch_attention.h) and `available_backends()`.

#include <nanobind/nanobind.h>

namespace pagoda::python {

/// Adds BatchAttention and available_backends() to `m`.
void bind_attention(nanobind::module_& m);

}  // namespace pagoda::python
