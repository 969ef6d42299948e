/// The `pagoda._pagoda` extension module: nanobind bindings over pagoda's C++ API. The Python
/// package `pagoda` (python/pagoda) wraps it; docs/design/python.md describes the seam.

#include <nanobind/nanobind.h>

#include "pagoda/python/attention_bindings.h"
#include "pagoda/python/cache_bindings.h"
#include "pagoda/python/engine_bindings.h"
#include "pagoda/python/sampling_bindings.h"
#include "pagoda/python/tensor_bridge.h"

NB_MODULE(_pagoda, m) {
  m.doc() = "pagoda's C++ API: paged attention kernels, KV pool, radix cache, offline engine.";
  pagoda::python::register_error_translator();
  pagoda::python::bind_attention(m);
  pagoda::python::bind_engine(m);
  pagoda::python::bind_cache(m);
  pagoda::python::bind_sampling(m);
}
