// OnednnLinear over oneDNN's matmul primitive (see onednn_linear.h). Without oneDNN in the build
// (PAGODA_HAVE_ONEDNN unset) every query names the missing package and construction throws.
#include "pagoda/kernels/cpu/onednn_linear.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

#ifdef PAGODA_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace pagoda::kernels::cpu {

#ifdef PAGODA_HAVE_ONEDNN

namespace {

using dnnl::memory;
using DnnlTag = memory::format_tag;

dnnl::engine& onednn_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::data_type onednn_type(DType t) {
  return t == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

/// The matmul descriptor of y[m, n] = x[m, k] · w with w given by `weights` ({k, n}); with
/// `accumulate` y += x · w (a sum post-op that reads y).
dnnl::matmul::primitive_desc matmul_pd(int64_t m, int64_t n, int64_t k, DType t,
                                       const memory::desc& weights, bool accumulate = false) {
  const memory::desc src({m, k}, onednn_type(t), DnnlTag::ab);
  const memory::desc dst({m, n}, memory::data_type::f32, DnnlTag::ab);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr,
                                      onednn_engine());
}

/// The probe behind onednn_linear_unavailable: can a small matmul of this dtype be built here?
bool onednn_matmul_builds(DType t) {
  try {
    (void)matmul_pd(1, 32, 32, t, memory::desc({32, 32}, onednn_type(t), DnnlTag::any));
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

/// Rows per block of the activations. oneDNN 2.6's AMX matmul runs M that is not a multiple
/// of 32 far slower than the next multiple (measured on the 2-core Xeon VM, 2 threads, bf16
/// [M, 2048] x [2048, 16384]: M 256 15.3 ms, 258 25.7, 272 35.2, 288 17.8; [M, 8192] x [8192,
/// 2048]: 256 7.3, 258 12.3, 288 9.0). So an M past one block runs as its whole blocks plus one
/// zero-padded block for the rest (a mixed step of 256 prefill tokens and 2 decode rows: 15.3 +
/// 2.6 ms instead of 25.7). One product of M rounded up to whole blocks was tried instead: it
/// computes fewer rows but needs the whole output copied out of a padded buffer, and in the
/// engine (8 x 128-token prompts, 2 threads) its gate/up products took as long or longer.
/// Up to one block (decode batches) M runs as it is: M 1, 8, 16 cost 1.5-1.7 ms there.
constexpr int64_t kOnednnRowBlock = 32;

/// The operand rows an m-row product reads: m, or past one block its whole blocks and the
/// zero-padded tail block.
constexpr int64_t operand_rows(int64_t m) {
  return m > kOnednnRowBlock ? (m + kOnednnRowBlock - 1) / kOnednnRowBlock * kOnednnRowBlock : m;
}

/// The M at which the weights' preferred layout is queried (a prefill-sized tile: oneDNN's
/// blocked weight layouts depend on N and K, not M).
constexpr int64_t kOnednnPackM = 32;

}  // namespace

// Not in the unnamed namespace: the Impl structs below hold one (-Wsubobject-linkage).
namespace onednn_detail {

/// The most recently used `capacity` built matmuls (a Value holding the primitive) by shape key;
/// build() makes a missing one, and a dnnl::error becomes Error(kInternal) naming `what` the
/// shape is.
template <typename Key, typename Value = dnnl::matmul>
class OnednnPrimitiveCache {
 public:
  explicit OnednnPrimitiveCache(size_t capacity) : capacity_(capacity) {}
  template <typename Build, typename What>
  Value& get(const Key& key, Build&& build, What&& what) {
    ++clock_;
    for (Entry& e : entries_)
      if (e.key == key) return e.last_use = clock_, e.value;
    if (entries_.size() == capacity_)
      entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& x, const Entry& y) {
                                        return x.last_use < y.last_use;
                                      }));
    try {
      entries_.push_back(Entry{key, clock_, Value(build())});
    } catch (const dnnl::error& e) {
      throw_error(ErrorCode::kInternal, "oneDNN builds no matmul for {}: {}", what(), e.what());
    }
    return entries_.back().value;
  }

 private:
  struct Entry {
    Key key;
    uint64_t last_use = 0;
    Value value;
  };
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace onednn_detail

std::string onednn_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool onednn_has_native_bf16() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

std::string onednn_linear_unavailable(DType weight_dtype) {
  if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16)
    return fmt::format("oneDNN linear layers take f32 or bf16 weights, not {}",
                       dtype_name(weight_dtype));
  static const bool f32_ok = onednn_matmul_builds(DType::kF32);
  static const bool bf16_ok = onednn_matmul_builds(DType::kBF16);
  if (weight_dtype == DType::kF32 ? f32_ok : bf16_ok) return "";
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{} has no {} matmul on this CPU (its ISA: {}; bf16 needs "
                     "AVX-512)",
                     v->major, v->minor, v->patch, dtype_name(weight_dtype), onednn_isa_name());
}

struct OnednnLinear::Impl {
  int64_t n = 0, k = 0;
  DType dtype = DType::kF32;
  memory::desc packed_md;
  memory weights;
  dnnl::stream stream{onednn_engine()};
  onednn_detail::OnednnPrimitiveCache<int64_t> cache{kMaxCached};  ///< by M
  /// The activations as the product reads them (input()): rounded to bf16 (bf16 weights)
  /// and / or with the tail block's zero rows up to operand_rows (bytes).
  std::vector<unsigned char> x_op;
  int64_t x_rows = 0;         ///< rows the last input() readied
  std::vector<float> y_tail;  ///< the tail block's output [kOnednnRowBlock, n]

  dnnl::matmul& primitive(int64_t m) {
    return cache.get(
        m, [&] { return matmul_pd(m, n, k, dtype, packed_md); },
        [&] { return fmt::format("{} M {} on its packed [{}, {}] weights", dtype_name(dtype), m, n, k); });
  }
};

OnednnLinear::OnednnLinear(const float* w, int64_t n, int64_t k, DType weight_dtype) {
  if (weight_dtype != DType::kBF16 || n < 1 || k < 1) {  // pack() refuses n or k < 1 unread
    pack(w, n, k, weight_dtype);
    return;
  }
  std::vector<uint16_t> rounded(static_cast<size_t>(n * k));
  for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = f32_to_bf16_bits(w[i]);
  pack(rounded.data(), n, k, DType::kBF16);
}

OnednnLinear::OnednnLinear(const uint16_t* w_bf16, int64_t n, int64_t k) {
  pack(w_bf16, n, k, DType::kBF16);
}

void OnednnLinear::pack(const void* w, int64_t n, int64_t k, DType weight_dtype) {
  PAGODA_REQUIRE(n >= 1 && k >= 1, kInvalidArgument, "OnednnLinear: n and k must be >= 1 (got {}, {})",
                 n, k);
  const std::string why = onednn_linear_unavailable(weight_dtype);
  PAGODA_REQUIRE(why.empty(), kUnsupported, "{}", why);
  impl_ = std::make_unique<Impl>();
  Impl& s = *impl_;
  s.n = n, s.k = k, s.dtype = weight_dtype;
  const memory::data_type t = onednn_type(weight_dtype);
  s.packed_md = matmul_pd(kOnednnPackM, n, k, weight_dtype, memory::desc({k, n}, t, DnnlTag::any))
                    .weights_desc();
  // The HF [n, k] row-major array is the {k, n} weights tensor in layout `ba`.
  const memory::desc plain_md({k, n}, t, DnnlTag::ba);
  const memory src(plain_md, onednn_engine(), const_cast<void*>(w));  // read only: the source
  s.weights = memory(s.packed_md, onednn_engine());
  dnnl::reorder(src, s.weights).execute(s.stream, const_cast<memory&>(src), s.weights);
  s.stream.wait();
}

OnednnLinear::~OnednnLinear() = default;
OnednnLinear::OnednnLinear(OnednnLinear&&) noexcept = default;
OnednnLinear& OnednnLinear::operator=(OnednnLinear&&) noexcept = default;

void* OnednnLinear::input(int64_t m) {
  Impl& s = *impl_;
  const size_t es = s.dtype == DType::kBF16 ? sizeof(uint16_t) : sizeof(float);
  const auto row_bytes = static_cast<size_t>(s.k) * es;
  s.x_op.resize(static_cast<size_t>(operand_rows(m)) * row_bytes);
  std::fill(s.x_op.begin() + static_cast<int64_t>(static_cast<size_t>(m) * row_bytes),
            s.x_op.end(), 0);
  s.x_rows = m;
  return s.x_op.data();
}

void OnednnLinear::forward(const float* x, float* y, int64_t m) {
  if (m == 0) return;
  Impl& s = *impl_;
  if (s.dtype == DType::kF32 && operand_rows(m) == m) return run(x, y, m);
  void* in = input(m);
  const int64_t count = m * s.k;
  if (s.dtype == DType::kBF16) {
    auto* xb = static_cast<uint16_t*>(in);
    // Over the threads for a prefill's rows (oneDNN's own pool: the same OpenMP threads).
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 15))
    for (int64_t i = 0; i < count; ++i) xb[i] = f32_to_bf16_bits(x[i]);
  } else {
    std::memcpy(in, x, static_cast<size_t>(count) * sizeof(float));
  }
  forward_input(y, m);
}

void OnednnLinear::forward_input(float* y, int64_t m) {
  Impl& s = *impl_;
  PAGODA_REQUIRE(m == s.x_rows, kInvalidArgument,
                 "OnednnLinear::forward_input: {} rows, but input() readied {}", m, s.x_rows);
  if (m > 0) run(s.x_op.data(), y, m);
}

void OnednnLinear::run(const void* x, float* y, int64_t m) {
  Impl& s = *impl_;
  const size_t es = s.dtype == DType::kBF16 ? sizeof(uint16_t) : sizeof(float);
  auto product = [&](const void* a, float* out, int64_t rows) {
    memory src_mem(memory::desc({rows, s.k}, onednn_type(s.dtype), DnnlTag::ab), onednn_engine(),
                   const_cast<void*>(a));  // read only
    memory dst_mem(memory::desc({rows, s.n}, memory::data_type::f32, DnnlTag::ab),
                   onednn_engine(), out);
    s.primitive(rows).execute(s.stream, {{DNNL_ARG_SRC, src_mem},
                                         {DNNL_ARG_WEIGHTS, s.weights},
                                         {DNNL_ARG_DST, dst_mem}});
    s.stream.wait();
  };
  // Past one block, the rows past the last whole block run as a second product of one
  // zero-padded block (see kOnednnRowBlock); y gets them from the block's scratch output.
  const int64_t main = m > kOnednnRowBlock ? m - m % kOnednnRowBlock : m;
  const int64_t tail = m - main;
  if (main > 0) product(x, y, main);
  if (tail == 0) return;
  s.y_tail.resize(static_cast<size_t>(kOnednnRowBlock * s.n));
  product(static_cast<const unsigned char*>(x) + static_cast<size_t>(main * s.k) * es,
          s.y_tail.data(), kOnednnRowBlock);
  std::memcpy(y + main * s.n, s.y_tail.data(), static_cast<size_t>(tail * s.n) * sizeof(float));
}

int64_t OnednnLinear::n() const { return impl_->n; }
int64_t OnednnLinear::k() const { return impl_->k; }
size_t OnednnLinear::weight_bytes() const { return impl_->packed_md.get_size(); }

struct OnednnMatmul::Impl {
  /// One built shape: the primitive and its three memory objects (handles reset per run).
  struct Bound {
    dnnl::matmul primitive;
    memory a, b, c;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, MatmulB, MatmulC>;
  DType dtype = DType::kF32;
  dnnl::stream stream{onednn_engine()};
  onednn_detail::OnednnPrimitiveCache<Key, Bound> cache{kMaxCached};

  Bound& bound(int64_t m, int64_t n, int64_t k, MatmulB b_layout, MatmulC c_mode) {
    return cache.get(
        std::make_tuple(m, n, k, b_layout, c_mode),
        [&] {
          const memory::data_type t = onednn_type(dtype);
          const memory::desc b_md({k, n}, t,
                                  b_layout == MatmulB::kRowsAreN ? DnnlTag::ba : DnnlTag::ab);
          const auto pd = matmul_pd(m, n, k, dtype, b_md, c_mode == MatmulC::kAccumulate);
          return Bound{dnnl::matmul(pd), memory(pd.src_desc(), onednn_engine(), nullptr),
                       memory(b_md, onednn_engine(), nullptr),
                       memory(pd.dst_desc(), onednn_engine(), nullptr)};
        },
        [&] { return fmt::format("{} [{}, {}] x [{}, {}]", dtype_name(dtype), m, k, k, n); });
  }
};

OnednnMatmul::OnednnMatmul() : impl_(std::make_unique<Impl>()) {
  const std::string f32_why = onednn_linear_unavailable(DType::kF32);
  PAGODA_REQUIRE(f32_why.empty(), kUnsupported, "{}", f32_why);
  impl_->dtype = onednn_linear_unavailable(DType::kBF16).empty() ? DType::kBF16 : DType::kF32;
}
OnednnMatmul::~OnednnMatmul() = default;
OnednnMatmul::OnednnMatmul(OnednnMatmul&&) noexcept = default;
OnednnMatmul& OnednnMatmul::operator=(OnednnMatmul&&) noexcept = default;

DType OnednnMatmul::operand_dtype() const { return impl_->dtype; }

void OnednnMatmul::run(const void* a, const void* b, float* c, int64_t m, int64_t n, int64_t k,
                       MatmulB b_layout, MatmulC c_mode) {
  Impl& s = *impl_;
  Impl::Bound& x = s.bound(m, n, k, b_layout, c_mode);
  x.a.set_data_handle(const_cast<void*>(a));  // read only
  x.b.set_data_handle(const_cast<void*>(b));  // read only
  x.c.set_data_handle(c);
  x.primitive.execute(s.stream, {{DNNL_ARG_SRC, x.a}, {DNNL_ARG_WEIGHTS, x.b}, {DNNL_ARG_DST, x.c}});
  s.stream.wait();
}

#else  // no oneDNN in this build

namespace {
constexpr const char* kNoOnednn =
    "this build has no oneDNN (install Debian's libdnnl-dev and reconfigure)";
}

std::string onednn_isa_name() { return "none"; }
bool onednn_has_native_bf16() { return false; }
std::string onednn_linear_unavailable(DType) { return kNoOnednn; }

struct OnednnLinear::Impl {};

OnednnLinear::OnednnLinear(const float*, int64_t, int64_t, DType) {
  throw_error(ErrorCode::kUnsupported, "{}", kNoOnednn);
}
OnednnLinear::OnednnLinear(const uint16_t*, int64_t, int64_t) {
  throw_error(ErrorCode::kUnsupported, "{}", kNoOnednn);
}
void OnednnLinear::pack(const void*, int64_t, int64_t, DType) {}
OnednnLinear::~OnednnLinear() = default;
OnednnLinear::OnednnLinear(OnednnLinear&&) noexcept = default;
OnednnLinear& OnednnLinear::operator=(OnednnLinear&&) noexcept = default;
void OnednnLinear::forward(const float*, float*, int64_t) {}
void* OnednnLinear::input(int64_t) { return nullptr; }
void OnednnLinear::forward_input(float*, int64_t) {}
void OnednnLinear::run(const void*, float*, int64_t) {}
int64_t OnednnLinear::n() const { return 0; }
int64_t OnednnLinear::k() const { return 0; }
size_t OnednnLinear::weight_bytes() const { return 0; }

struct OnednnMatmul::Impl {};
OnednnMatmul::OnednnMatmul() { throw_error(ErrorCode::kUnsupported, "{}", kNoOnednn); }
OnednnMatmul::~OnednnMatmul() = default;
OnednnMatmul::OnednnMatmul(OnednnMatmul&&) noexcept = default;
OnednnMatmul& OnednnMatmul::operator=(OnednnMatmul&&) noexcept = default;
DType OnednnMatmul::operand_dtype() const { return DType::kF32; }
void OnednnMatmul::run(const void*, const void*, float*, int64_t, int64_t, int64_t, MatmulB,
                       MatmulC) {}

#endif

}  // namespace pagoda::kernels::cpu
