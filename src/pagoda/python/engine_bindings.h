#pragma once
/// Python bindings of the offline engine (`pagoda._pagoda.Engine`, wrapped by pagoda.LLM) and
/// of the server (`pagoda._pagoda.serve`, wrapped by pagoda.serve).

#include <nanobind/nanobind.h>

namespace pagoda::python {

/// Adds Engine, and serve() when this build has the server, to `m`.
void bind_engine(nanobind::module_& m);

}  // namespace pagoda::python
