#pragma once
/// Python bindings of the kernel-level attention API: `pagoda._pagoda.BatchAttention` (plan/run
/// over a CSR page table, attention/batch_attention.h) and `available_backends()`.

#include <nanobind/nanobind.h>

#include "pagoda/backends/kernel_options.h"

namespace pagoda::python {

/// KernelOptions from a Python dict {name: value} (values bool, int or str; backends/
/// kernel_options.h names them): ValueError naming an unknown name or a bad value.
backends::KernelOptions kernel_options_of(const nanobind::dict& options);

/// Adds BatchAttention and available_backends() to `m`.
void bind_attention(nanobind::module_& m);

}  // namespace pagoda::python
