#include "pagoda/python/cache_bindings.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "pagoda/cache/radix_cache.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/platform/platform.h"
#include "pagoda/python/tensor_bridge.h"

namespace nb = nanobind;

namespace pagoda::python {
namespace {

using Int32Host = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32Out = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

/// A NumPy int32 array owning a copy of `v`.
Int32Out to_numpy(std::vector<int32_t> v) {
  auto* owned = new std::vector<int32_t>(std::move(v));
  nb::capsule free_it(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return Int32Out(owned->data(), {owned->size()}, free_it);
}

std::span<const int32_t> span_of(const Int32Host& a) { return {a.data(), a.shape(0)}; }

/// The NumPy storage type of a pagoda dtype (bf16 as uint16 bits, fp8 as uint8 bits).
nb::dlpack::dtype numpy_storage(DType t) {
  switch (t) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBF16: return nb::dtype<uint16_t>();
    default: return nb::dtype<uint8_t>();
  }
}

/// A host KV pool with its own CPU platform (the allocator must outlive the pool).
class PyKvPool {
 public:
  PyKvPool(const kv::KvPoolConfig& config)
      : platform_(platform::make_cpu_platform()),
        pool_(std::make_unique<kv::KvPool>(config, platform_->allocator())) {}

  /// A NumPy view of a layer's K or V storage, kept alive by the pool object `self`.
  static nb::ndarray<nb::numpy> view(nb::handle self, int layer, bool value) {
    PyKvPool& me = nb::cast<PyKvPool&>(self);
    const TensorView t = value ? me.pool_->v_view(LayerId{layer}) : me.pool_->k_view(LayerId{layer});
    std::vector<size_t> shape(t.rank());
    std::vector<int64_t> strides(t.rank());
    for (int d = 0; d < t.rank(); ++d) {
      shape[d] = static_cast<size_t>(t.size(d));
      strides[d] = t.stride(d);
    }
    return nb::ndarray<nb::numpy>(t.data(), t.rank(), shape.data(), self, strides.data(),
                                  numpy_storage(t.dtype()));
  }

  void set_kv(int layer, const Int32Host& loc, const AnyArray& k, const std::optional<AnyArray>& v,
              const std::string& dtype) {
    const TensorView kv = to_view(k, dtype, "k");
    const TensorView vv = v ? to_view(*v, dtype, "v") : TensorView();
    pool_->set_kv(LayerId{layer}, span_of(loc), kv, vv);
  }

  kv::KvPool& pool() { return *pool_; }

 private:
  std::unique_ptr<platform::Platform> platform_;
  std::unique_ptr<kv::KvPool> pool_;
};

kv::KvPoolConfig pool_config(int num_layers, int num_pages, int page_size, int num_kv_heads,
                             int head_dim, const std::string& dtype, int head_dim_v,
                             int kv_lora_rank, int rope_dim) {
  const std::optional<DType> t = parse_dtype(dtype);
  PAGODA_REQUIRE(t.has_value(), kInvalidArgument, "KvPool: unknown dtype '{}'", dtype);
  kv::KvPoolConfig c{.layout = kv_lora_rank > 0 ? kv::KvLayout::kMla : kv::KvLayout::kMha,
                     .num_layers = num_layers,
                     .num_pages = num_pages,
                     .page_size = page_size,
                     .dtype = *t};
  if (kv_lora_rank > 0) {
    c.kv_lora_rank = kv_lora_rank;
    c.rope_dim = rope_dim;
  } else {
    c.num_kv_heads = num_kv_heads;
    c.head_dim = head_dim;
    c.head_dim_v = head_dim_v;
  }
  return c;
}

/// A radix tree over a PageAllocator (match / insert / locks / evict; no request table).
class PyRadixCache {
 public:
  explicit PyRadixCache(kv::PageAllocator& allocator) : cache_(allocator) {}

  std::tuple<Int32Out, cache::NodeHandle> match_prefix(const std::vector<int32_t>& tokens,
                                                       const std::string& extra_key) {
    std::vector<SlotIndex> slots;
    const cache::PrefixMatch m =
        cache_.match_prefix(cache::RadixKey{tokens, extra_key}, cache::kNoPrefixLimit, slots);
    std::vector<int32_t> out(slots.begin(), slots.end());
    return {to_numpy(std::move(out)), m.last_node};
  }

  int64_t insert(const std::vector<int32_t>& tokens, const Int32Host& slots,
                 const std::string& extra_key) {
    const auto* p = reinterpret_cast<const SlotIndex*>(slots.data());
    return cache_.insert(cache::RadixKey{tokens, extra_key}, std::span(p, slots.shape(0)))
        .prefix_len;
  }

  cache::RadixCache& cache() { return cache_; }

 private:
  cache::RadixCache cache_;
};

static_assert(sizeof(SlotIndex) == sizeof(int32_t));

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<PyKvPool>(m, "KvPool",
      "A host KV cache: per layer K [num_pages + 1, page_size, num_kv_heads, head_dim] and V "
      "(head_dim_v), NHD, zero-filled; page 0 is reserved. MLA pools (kv_lora_rank > 0) hold one "
      "latent row [.., 1, kv_lora_rank + rope_dim] whose first kv_lora_rank elements are V.")
      .def("__init__",
           [](PyKvPool* self, int num_layers, int num_pages, int page_size, int num_kv_heads,
              int head_dim, const std::string& dtype, int head_dim_v, int kv_lora_rank,
              int rope_dim) {
             new (self) PyKvPool(pool_config(num_layers, num_pages, page_size, num_kv_heads,
                                             head_dim, dtype, head_dim_v, kv_lora_rank,
                                             rope_dim));
           },
           nb::arg("num_layers"), nb::arg("num_pages"), nb::arg("page_size"),
           nb::arg("num_kv_heads") = 0, nb::arg("head_dim") = 0, nb::arg("dtype") = "f32",
           nb::arg("head_dim_v") = 0, nb::arg("kv_lora_rank") = 0, nb::arg("rope_dim") = 0)
      .def("k_cache", [](nb::handle self, int layer) { return PyKvPool::view(self, layer, false); },
           nb::arg("layer"),
           "K of `layer` as a NumPy view of the pool's memory (no copy; bf16 as uint16 bits, "
           "fp8 as uint8 bits); valid while the pool lives (the view keeps it alive).")
      .def("v_cache", [](nb::handle self, int layer) { return PyKvPool::view(self, layer, true); },
           nb::arg("layer"), "V of `layer`, as k_cache (MLA: a strided view of the latent rows).")
      .def("set_kv", &PyKvPool::set_kv, nb::arg("layer"), nb::arg("loc"), nb::arg("k"),
           nb::arg("v") = nb::none(), nb::arg("dtype") = "",
           "Writes n tokens at slots loc (int32 [n]): k [n, heads, head_dim], v [n, heads, "
           "head_dim_v] (MLA: v None), any float dtype (dtype names bf16 given as uint16). "
           "Everything is checked before anything is written.")
      .def("set_scales", [](PyKvPool& p, int layer, float k, float v) {
             p.pool().set_scales(LayerId{layer}, k, v);
           }, nb::arg("layer"), nb::arg("k_scale"), nb::arg("v_scale"))
      .def_prop_ro("num_slots", [](PyKvPool& p) { return p.pool().num_slots(); })
      .def_prop_ro("page_size", [](PyKvPool& p) { return p.pool().page_size(); })
      .def_prop_ro("num_layers", [](PyKvPool& p) { return p.pool().num_layers(); });

  nb::class_<kv::PageAllocator>(m, "PageAllocator",
      "SGLang's paged allocator with reference-counted pages (ids 1..num_pages; page 0 "
      "reserved). Slots are page * page_size + offset.")
      .def(nb::init<int32_t, int32_t>(), nb::arg("num_pages"), nb::arg("page_size"))
      .def("alloc",
           [](kv::PageAllocator& a, int64_t n) -> std::optional<Int32Out> {
             std::optional<std::vector<SlotIndex>> s = a.alloc(n);
             if (!s) return std::nullopt;
             return to_numpy(std::vector<int32_t>(s->begin(), s->end()));
           },
           nb::arg("num_tokens"),
           "Slots of num_tokens / page_size whole pages (int32), or None when they do not fit.")
      .def("free", [](kv::PageAllocator& a, const Int32Host& slots) {
             a.free(std::span(reinterpret_cast<const SlotIndex*>(slots.data()), slots.shape(0)));
           }, nb::arg("slots"), "Drops one reference from every page named.")
      .def_prop_ro("page_size", &kv::PageAllocator::page_size)
      .def_prop_ro("num_pages", &kv::PageAllocator::num_pages)
      .def("available_size", &kv::PageAllocator::available_size)
      .def("num_free_pages", &kv::PageAllocator::num_free_pages)
      .def("check_integrity", &kv::PageAllocator::check_integrity);

  nb::class_<cache::NodeHandle>(m, "RadixNode", "A node of a RadixCache (opaque).")
      .def_prop_ro("is_root_or_none", [](const cache::NodeHandle& h) { return !h.has_node(); });

  nb::class_<PyRadixCache>(m, "RadixCache",
      "The page-aligned radix prefix cache over a PageAllocator (LRU eviction). Matching and "
      "splitting happen at page boundaries; insert() takes the tree's own page references.")
      .def(nb::init<kv::PageAllocator&>(), nb::arg("allocator"), nb::keep_alive<1, 2>())
      .def("match_prefix", &PyRadixCache::match_prefix, nb::arg("tokens"),
           nb::arg("extra_key") = "",
           "(slots int32 of the longest cached page-aligned prefix, last node). Lock the node "
           "(inc_lock_ref) before using the slots.")
      .def("insert", &PyRadixCache::insert, nb::arg("tokens"), nb::arg("slots"),
           nb::arg("extra_key") = "",
           "Stores tokens -> slots (whole pages); returns the length already present. The "
           "caller keeps (and later frees) its own references.")
      .def("inc_lock_ref", [](PyRadixCache& c, cache::NodeHandle n) { c.cache().inc_lock_ref(n); })
      .def("dec_lock_ref", [](PyRadixCache& c, cache::NodeHandle n) { c.cache().dec_lock_ref(n); })
      .def("evict", [](PyRadixCache& c, int64_t n) { return c.cache().evict(n); },
           nb::arg("num_tokens"), "Evicts unlocked leaves (LRU); returns the tokens freed.")
      .def("evictable_size", [](PyRadixCache& c) { return c.cache().evictable_size(); })
      .def("protected_size", [](PyRadixCache& c) { return c.cache().protected_size(); })
      .def("num_nodes", [](PyRadixCache& c) { return c.cache().num_nodes(); })
      .def("hit_rate", [](PyRadixCache& c) { return c.cache().stats().hit_rate(); })
      .def("check_integrity", [](PyRadixCache& c) { c.cache().check_integrity(); });
}

}  // namespace pagoda::python
