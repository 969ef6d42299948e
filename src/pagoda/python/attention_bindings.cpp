#include "pagoda/python/attention_bindings.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"
#include "pagoda/backends/reference/reference_batch_attention.h"
#include "pagoda/core/error.h"
#include "pagoda/python/tensor_bridge.h"
#ifdef PAGODA_HAVE_CUDA_BACKEND
#include "pagoda/backends/cuda/cuda_batch_attention.h"
#endif

namespace nb = nanobind;

namespace pagoda::python {
namespace {

using Int32Host = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64Host = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8Host = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32Host = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
std::span<const T> span_of(const nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>& a) {
  return {a.data(), a.shape(0)};
}

DType dtype_named(const std::string& name, const char* what) {
  const std::optional<DType> t = parse_dtype(name);
  PAGODA_REQUIRE(t.has_value(), kInvalidArgument, "BatchAttention.plan: unknown {} '{}'", what,
                 name);
  return *t;
}

/// One BatchAttention implementation plus the device its tensors must live on.
class PyBatchAttention {
 public:
  PyBatchAttention(const std::string& backend, int num_threads, uintptr_t cuda_stream,
                   const nb::dict& kernel_options) {
    const backends::KernelOptions kernels = kernel_options_of(kernel_options);
    if (backend == "cpu") {
      impl_ = backends::make_cpu_batch_attention({.num_threads = num_threads,
                                                  .bf16_tiles = kernels.cpu_bf16,
                                                  .bf16_decode = kernels.cpu_bf16_decode});
    } else if (backend == "reference") {
      impl_ = backends::make_reference_batch_attention();
    } else if (backend == "cuda") {
#ifdef PAGODA_HAVE_CUDA_BACKEND
      impl_ = std::make_unique<backends::cuda::CudaBatchAttention>(
          reinterpret_cast<cudaStream_t>(cuda_stream), kernels);
      device_ = DeviceKind::kCuda;
#else
      throw_error(ErrorCode::kUnsupported,
                  "BatchAttention: backend 'cuda' is not in this build (built without CUDA)");
#endif
    } else {
      throw_error(ErrorCode::kInvalidArgument,
                  "BatchAttention: unknown backend '{}' (cpu, reference, cuda)", backend);
    }
  }

  std::string name() const { return impl_->name(); }

  void plan(const Int32Host& qo_indptr, const Int32Host& kv_indptr, const Int32Host& kv_indices,
            const Int32Host& kv_last_page_len, int page_size, int num_qo_heads, int num_kv_heads,
            int head_dim_qk, int head_dim_vo, const std::string& q_dtype,
            const std::string& kv_dtype, const std::string& out_dtype,
            const std::optional<U8Host>& custom_mask, const std::optional<Int64Host>& mask_indptr) {
    PAGODA_REQUIRE(custom_mask.has_value() == mask_indptr.has_value(), kInvalidArgument,
                   "BatchAttention.plan: custom_mask and mask_indptr go together");
    attention::PagedPlanInput in{.qo_indptr = span_of(qo_indptr),
                                 .kv_indptr = span_of(kv_indptr),
                                 .kv_indices = span_of(kv_indices),
                                 .kv_last_page_len = span_of(kv_last_page_len),
                                 .page_size = page_size};
    if (custom_mask) {
      in.custom_mask = span_of(*custom_mask);
      in.mask_indptr = span_of(*mask_indptr);
    }
    const attention::AttentionShape shape{.num_qo_heads = num_qo_heads,
                                          .num_kv_heads = num_kv_heads,
                                          .head_dim_qk = head_dim_qk,
                                          .head_dim_v = head_dim_vo,
                                          .q_dtype = dtype_named(q_dtype, "q_dtype"),
                                          .kv_dtype = dtype_named(kv_dtype, "kv_dtype"),
                                          .out_dtype = dtype_named(out_dtype, "out_dtype")};
    impl_->plan(in, shape);
    planned_ = true;
  }

  void run(const AnyArray& q, const AnyArray& k_cache, const AnyArray& v_cache,
           const AnyArray& out, const std::optional<AnyArray>& lse, float sm_scale,
           float logits_soft_cap, int window_left, bool causal, const std::optional<F32Host>& sinks,
           float k_scale, float v_scale, const std::string& q_dtype, const std::string& kv_dtype,
           const std::string& out_dtype) {
    PAGODA_REQUIRE(planned_, kFailedPrecondition, "BatchAttention.run: called before plan()");
    const TensorView qv = to_view(q, q_dtype, "q");
    const TensorView kv = to_view(k_cache, kv_dtype, "k_cache");
    const TensorView vv = to_view(v_cache, kv_dtype, "v_cache");
    const TensorView ov = to_view(out, out_dtype, "out");
    const TensorView lv = lse ? to_view(*lse, "", "lse") : TensorView();
    for (const TensorView* t : {&qv, &kv, &vv, &ov, &lv}) {
      if (t->empty()) continue;
      PAGODA_REQUIRE(t->device().kind == device_, kInvalidArgument,
                     "BatchAttention.run: backend '{}' needs {} tensors, got {}", impl_->name(),
                     device_ == DeviceKind::kCpu ? "cpu" : "cuda", t->describe());
      PAGODA_REQUIRE(t->device() == qv.device(), kInvalidArgument,
                     "BatchAttention.run: every tensor must be on q's device {}, got {}",
                     qv.device().to_string(), t->describe());
    }
    attention::RunParams params{.sm_scale = sm_scale,
                                .logit_cap = logits_soft_cap,
                                .window_left = window_left,
                                .mask = causal ? attention::MaskKind::kCausal : attention::MaskKind::kNonCausal,
                                .k_scale = k_scale,
                                .v_scale = v_scale};
    if (sinks) params.sinks = span_of(*sinks);
    nb::gil_scoped_release release;
    impl_->run(qv, kv, vv, ov, lv, params);
  }

 private:
  std::unique_ptr<attention::BatchAttention> impl_;
  DeviceKind device_ = DeviceKind::kCpu;
  bool planned_ = false;
};

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"cpu", "reference"};
#ifdef PAGODA_HAVE_CUDA_BACKEND
  names.emplace_back("cuda");
#endif
  return names;
}

}  // namespace

backends::KernelOptions kernel_options_of(const nb::dict& options) {
  backends::KernelOptions o;
  for (const auto& [name, value] : options) {
    const std::string v = nb::isinstance<nb::bool_>(value) ? (nb::cast<bool>(value) ? "true" : "false")
                                                           : std::string(nb::str(value).c_str());
    backends::set_kernel_option(o, std::string(nb::str(name).c_str()) + "=" + v);
  }
  return o;
}

void bind_attention(nb::module_& m) {
  m.def("available_backends", &available_backends,
        "BatchAttention implementations in this build: 'cpu', 'reference' and, when built with "
        "CUDA, 'cuda'.");
  nb::class_<PyBatchAttention>(m, "BatchAttention",
      "Paged attention over a CSR page table (FlashInfer conventions): plan() once per step on "
      "host int32 arrays, run() per layer. Causal masks are bottom-right aligned, window_left "
      "keeps window_left + 1 keys (-1: off), soft cap is cap * tanh(sm_scale * q.k / cap), LSE "
      "is base 2. Not thread-safe.")
      .def(nb::init<const std::string&, int, uintptr_t, const nb::dict&>(),
           nb::arg("backend") = "cpu", nb::arg("num_threads") = 0, nb::arg("cuda_stream") = 0,
           nb::arg("kernel_options") = nb::dict(),
           "backend: 'cpu' (SIMD + OpenMP, num_threads threads; 0 = all), 'reference' (fp64 "
           "oracle) or 'cuda' (work goes to cuda_stream, a cudaStream_t as an integer; 0 = the "
           "legacy default stream). kernel_options: {name: value} as `--kernel-option` "
           "(cpu_bf16, cpu_bf16_decode for 'cpu'; the CUDA ones for 'cuda'); ValueError naming "
           "an unknown name or a bad value.")
      .def_prop_ro("name", &PyBatchAttention::name)
      .def("plan", &PyBatchAttention::plan, nb::arg("qo_indptr"), nb::arg("kv_indptr"),
           nb::arg("kv_indices"), nb::arg("kv_last_page_len"), nb::arg("page_size"),
           nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim_qk"),
           nb::arg("head_dim_vo"), nb::arg("q_dtype"), nb::arg("kv_dtype"), nb::arg("out_dtype"),
           nb::arg("custom_mask") = nb::none(), nb::arg("mask_indptr") = nb::none(),
           "Plans one step. qo_indptr [bs+1], kv_indptr [bs+1] (pages), kv_indices [kv_indptr[-1]]"
           " (page ids), kv_last_page_len [bs]: host int32, C-contiguous. custom_mask: host uint8 "
           "bits (little-endian, row-major [qo_len, kv_len] per request from byte mask_indptr[b]"
           ", int64). dtypes by name ('f32', 'f16', 'bf16', 'fp8_e4m3', 'fp8_e5m2'). Raises "
           "ValueError on a malformed table, NotImplementedError for what the backend lacks.")
      .def("run", &PyBatchAttention::run, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
           nb::arg("out"), nb::arg("lse") = nb::none(), nb::arg("sm_scale") = 1.f,
           nb::arg("logits_soft_cap") = 0.f, nb::arg("window_left") = -1,
           nb::arg("causal") = true, nb::arg("sinks") = nb::none(), nb::arg("k_scale") = 1.f,
           nb::arg("v_scale") = 1.f, nb::arg("q_dtype") = "", nb::arg("kv_dtype") = "",
           nb::arg("out_dtype") = "",
           "Runs the planned step, writing out in place (and lse when given). q [nnz, Hq, Dqk], "
           "k_cache [pages, page_size, Hkv, Dqk], v_cache [pages, page_size, Hkv, Dv] (any "
           "strides, e.g. an HND cache viewed as NHD), out [nnz, Hq, Dv], lse [nnz, Hq] f32. "
           "*_dtype names a dtype DLPack lacks (bf16 over uint16, fp8 over uint8). No copy; the "
           "GIL is released while the kernel runs.");
}

}  // namespace pagoda::python
