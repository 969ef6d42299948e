#pragma once
/// KvPool: the per-layer K/V storage of the paged KV cache (sglang_spec §3.2, §3.3).
///
/// Sizing. A pool for `num_pages` usable pages holds num_pages + 1 pages: page 0 is the reserved
/// dummy page (padded batches write there harmlessly), pages 1..num_pages match PageAllocator's
/// ids. Slot s = page * page_size + offset indexes a token row; num_slots() = (num_pages + 1) * P.
///
/// Layouts (NHD, token-major; one slot is one contiguous row):
///   MHA: per layer, K [num_pages + 1, page_size, num_kv_heads, head_dim] and
///        V [num_pages + 1, page_size, num_kv_heads, head_dim_v] (separate allocations).
///   MLA: per layer, one latent buffer [num_pages + 1, page_size, 1, kv_lora_rank + rope_dim];
///        k_view() is the whole row, v_view() the first kv_lora_rank elements of it.
///   DSA index keys (MLA with index_head_dim > 0, DeepSeek-V3.2's lightning indexer): per layer
///        one more buffer [num_pages + 1, page_size, index_head_dim + 4] bytes, the same slots
///        as the latent rows: index_head_dim fp8 e4m3 codes, then the token's f32 scale (a power
///        of two, 2^ceil(log2(amax / 448)), DeepSeek's ue8m0 block scale with one block per key;
///        quantize_index_key below). The stored key is code · scale. move_kv moves these rows
///        with the latent rows.
/// Storage dtype f32 / f16 / bf16 / fp8 e4m3 / fp8 e5m2 (fp8 stored as raw bytes). Per-layer
/// scales: the stored value is convert(x / k_scale) (resp. v_scale); readers multiply back.
///
/// Layers. A pool stores `num_layers` layers, indexed 0..num_layers-1 (LayerId is the pool's own
/// index: with the SWA pool the model's full-attention layers live in one pool and its window
/// layers in another, each numbered by rank among its kind, LlamaModel::pool_layer). A pool of 0
/// layers allocates nothing: its pages are ids only (the full pool of a model whose every layer
/// has a window).
///
/// Memory comes from a platform::Allocator; the pool owns it. Host pools (CPU allocator) support
/// set_kv()/fill()/k_at(); device pools are written by the CUDA backend through the raw base
/// pointers and strides (k_view/v_view). The pool knows nothing about requests. Not thread-safe.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/ids.h"
#include "pagoda/core/tensor_view.h"
#include "pagoda/platform/platform.h"

namespace pagoda::kv {

enum class KvLayout : uint8_t {
  kMha,  ///< separate K and V per layer
  kMla,  ///< one latent (kv_lora_rank + rope_dim) row per token, shared by K and V
};

/// Shape and dtype of a pool; use designated initialisers. Unused fields stay 0.
struct KvPoolConfig {
  KvLayout layout = KvLayout::kMha;
  int32_t num_layers = 0;
  int32_t num_pages = 0;   ///< usable pages (page 0 is added on top)
  int32_t page_size = 1;
  DType dtype = DType::kBF16;
  // MHA
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;  ///< 0 means head_dim
  // MLA
  int32_t kv_lora_rank = 0;
  int32_t rope_dim = 0;
  int32_t index_head_dim = 0;  ///< MLA only: DSA index-key width (0 = no index keys)
};

/// Per-layer readiness of a pool's pages: the hierarchical cache's load-back copies pages into
/// the pool layer by layer while the model runs, and the forward calls KvPool::wait_layer(l)
/// before layer l's attention reads the pool. wait() makes the compute stream (on the CPU: the
/// calling thread) wait until layer `layer`'s pending copies are done.
class LayerGate {
 public:
  virtual ~LayerGate() = default;
  virtual void wait(LayerId layer) = 0;
};

/// Bytes one token of a pool of `config` occupies over its layers (SGLang's cell_size: K and V
/// rows, or the MLA latent row, in config.dtype, plus the DSA index key and its f32 scale),
/// computed without allocating: what KvPool::bytes_per_token() returns for that pool. Throws
/// Error(kInvalidArgument) for a shape the pool would refuse.
int64_t kv_bytes_per_token(const KvPoolConfig& config);

/// One DSA index key x [dim] (f32) as its stored row (the layout above): scale = 2^e with e the
/// least integer such that amax / 448 <= 2^e (amax / 448 rounded to f32 first; exact: taken
/// from frexp, not a floating-point log), 1 for an all-zero key; row[j] = e4m3(x[j] / scale)
/// (RNE, saturating), then the f32 scale. The CUDA side applies the same rule bit for bit
/// (kernels/cuda/index_key.cuh: the model ops' store_index_keys, the indexer's queries).
void quantize_index_key(const float* x, int64_t dim, uint8_t* row);
/// x [dim] on the index-key grid: out[j] = e4m3 code · scale of quantize_index_key(x), exact in
/// f32. The DSA indexer's queries take this form per head (DeepSeek-V3.2 quantises them as its
/// keys: e4m3 with a ue8m0 scale per 128-element block, here one block per head).
void round_to_index_grid(const float* x, int64_t dim, float* out);

class KvPool {
 public:
  /// Validates `config` (kInvalidArgument: negative layers or pages, non-positive other sizes, a
  /// non-float dtype, MLA without a rank) and allocates every layer from `allocator`,
  /// zero-filled. `allocator` must outlive the pool.
  KvPool(const KvPoolConfig& config, platform::Allocator& allocator);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvPoolConfig& config() const { return config_; }
  Device device() const { return allocator_->device(); }
  int32_t num_layers() const { return config_.num_layers; }
  int32_t page_size() const { return config_.page_size; }
  /// Addressable slots including page 0: (num_pages + 1) * page_size.
  int64_t num_slots() const { return num_slots_; }
  /// Elements of one K row (MHA: num_kv_heads * head_dim; MLA: kv_lora_rank + rope_dim).
  int64_t k_row_elems() const { return k_row_; }
  /// Elements of one V row (MHA: num_kv_heads * head_dim_v; MLA: kv_lora_rank, strided in K's row).
  int64_t v_row_elems() const { return v_row_; }
  /// Bytes one token occupies over all layers (SGLang's cell_size).
  int64_t bytes_per_token() const;
  /// Bytes the constructor allocated for K/V (sum of its buffers' sizes; equals num_slots() *
  /// bytes_per_token()).
  int64_t total_bytes() const { return allocated_bytes_; }

  /// K of `layer`: [num_pages + 1, page_size, heads, head_dim] (MLA: heads 1, dim rank + rope) in
  /// the storage dtype. Throws kOutOfRange for a bad layer. The view lives as long as the pool.
  TensorView k_view(LayerId layer) const;
  /// V of `layer`: [num_pages + 1, page_size, heads, head_dim_v] (MLA: a strided view of the first
  /// kv_lora_rank elements of the latent rows).
  TensorView v_view(LayerId layer) const;

  /// Sets the dequantisation scales of `layer` (> 0, finite). Default 1. An MLA pool needs
  /// v_scale == k_scale (V is the stored latent row); kInvalidArgument otherwise, pool unchanged.
  void set_scales(LayerId layer, float k_scale, float v_scale);
  float k_scale(LayerId layer) const;
  float v_scale(LayerId layer) const;

  /// Writes n tokens of `layer` at slots `loc`: k is [n, heads, head_dim] (MLA: [n, 1, rank+rope]),
  /// v is [n, heads, head_dim_v] (MLA: must be empty), any float dtype, any strides, host memory.
  /// Stores convert(x / scale). Validates everything (layer, shapes, every slot in
  /// [0, num_slots())) before writing; on Error nothing changed. Host pools only (kUnsupported).
  void set_kv(LayerId layer, std::span<const SlotIndex> loc, const TensorView& k,
              const TensorView& v);

  /// Element (slot, head, d) of K / V as f32, multiplied by the layer's scale (host pools only).
  float k_at(LayerId layer, SlotIndex slot, int32_t head, int32_t d) const;
  float v_at(LayerId layer, SlotIndex slot, int32_t head, int32_t d) const;

  /// Bytes of one index-key row (index_head_dim + 4; 0 without index keys).
  int64_t index_row_bytes() const { return index_row_; }
  /// Quantises n = loc.size() keys k [n, index_head_dim] (f32, host) of `layer` into the index
  /// rows at `loc` (layout above). Validates the layer, the slots and that the pool has index
  /// keys (kInvalidArgument / kOutOfRange, nothing written). Host pools only.
  void set_index_keys(LayerId layer, std::span<const SlotIndex> loc, const float* k);
  /// The index rows of `layer`, [num_slots, index_row_bytes()] (host pools only).
  const uint8_t* index_rows(LayerId layer) const;
  /// The same rows on the pool's device, for raw copies (page moves between pools): any device;
  /// kInvalidArgument without index keys, kOutOfRange for a bad layer.
  void* index_data(LayerId layer) const;
  /// Element d of the stored index key of `slot` (code · scale), host pools only.
  float index_key_at(LayerId layer, SlotIndex slot, int32_t d) const;
  /// Sets every stored element of every layer to convert(value) (e.g. NaN poisoning in tests;
  /// e4m3 has a NaN code, so NaN survives every dtype). Host pools only.
  void fill(float value);
  /// Sets every byte of every buffer to `byte` through the allocator (any device).
  void fill_bytes(uint8_t byte);

  /// Installs the gate wait_layer() consults (nullptr: none, the default). The gate must stay
  /// valid while installed. Set between steps by the thread that runs the forward.
  void set_layer_gate(LayerGate* gate) { gate_ = gate; }
  /// Waits for `layer`'s pending page copies (through the installed gate; no-op without one).
  /// Called by the forward before layer `layer`'s attention.
  void wait_layer(LayerId layer) const {
    if (gate_ != nullptr) gate_->wait(layer);
  }

  /// Copies the K and V rows of slot src[i] to slot dst[i] in every layer (speculative decoding
  /// moves accepted K/V into place). All rows are read before any is written, so sources and
  /// destinations may overlap. Raw bytes (scales unchanged). Any device: rows go through the
  /// allocator's host copies (synchronous; moves are few per step). Throws kInvalidArgument /
  /// kOutOfRange (nothing changed) for unequal sizes or a slot outside [0, num_slots()).
  void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst);

 private:
  void require_layer(LayerId layer) const;
  void require_host(const char* what) const;
  void write_rows(void* base, int64_t row_elems, std::span<const SlotIndex> loc,
                  const TensorView& src, float scale);
  float read_elem(const void* base, int64_t row_elems, SlotIndex slot, int64_t index,
                  float scale) const;

  KvPoolConfig config_;
  platform::Allocator* allocator_;
  int64_t num_slots_ = 0;
  int64_t k_row_ = 0;
  int64_t v_row_ = 0;
  int64_t allocated_bytes_ = 0;
  std::vector<platform::DeviceBuffer> k_buffers_;
  std::vector<platform::DeviceBuffer> v_buffers_;  ///< empty for MLA
  std::vector<platform::DeviceBuffer> index_buffers_;  ///< DSA index rows (empty without)
  int64_t index_row_ = 0;
  std::vector<float> k_scales_;
  std::vector<float> v_scales_;
  LayerGate* gate_ = nullptr;
};

}  // namespace pagoda::kv
