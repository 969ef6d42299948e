#include "pagoda/backends/cuda/cuda_linear_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kernels/cuda/launch.h"

namespace pagoda::backends {

using attention::LinearLayer;
using attention::LinearSeq;

namespace {

/// Grows `buf` (and `capacity`) to at least `bytes` from `allocator`; the caller has made sure
/// no queued work still reads the old buffer.
void grow(platform::DeviceBuffer& buf, size_t& capacity, size_t bytes,
          platform::Allocator& allocator) {
  if (bytes <= capacity) return;
  capacity = std::max({bytes, 2 * capacity, size_t{256}});
  buf = platform::make_buffer(allocator, capacity);
}

}  // namespace

const attention::LinearCapabilities& CudaLinearBackend::static_capabilities() {
  static const attention::LinearCapabilities caps{
      .dtypes = {DType::kF32}, .tree_verify = true, .cuda_graph = false, .device = "cuda"};
  return caps;
}

CudaLinearBackend::CudaLinearBackend(const attention::LinearBackendContext& ctx)
    : platform_(ctx.platform) {
  PAGODA_REQUIRE(platform_ != nullptr && platform_->kind() == platform::PlatformKind::kCuda &&
                     platform_->native_stream() != nullptr,
                 kInvalidArgument,
                 "the cuda linear-attention backend needs a CUDA platform in its context");
  stream_ = static_cast<cudaStream_t>(platform_->native_stream());
  plan_uploaded_ = platform_->make_event();
}

void CudaLinearBackend::planned() {
  const std::span<const LinearSeq> seqs = this->seqs();
  const kv::StateShape& shape = pool().shape();
  const auto s = static_cast<int32_t>(seqs.size());
  // SSD chunks only where the chunked scan's shared memory fits the device.
  const bool chunkable = kernels::cuda::ssd_chunk_smem_bytes(shape.head_dim, shape.state_size) <=
                         static_cast<int64_t>(platform_->capabilities().max_smem_per_block);
  auto chunks_of = [&](const LinearSeq& q) {
    return chunkable ? kernels::cuda::ssd_chunks(q.num_tokens, !q.node_slots.empty()) : 0;
  };
  auto tiles_of = [](const LinearSeq& q) {
    return kernels::cuda::conv_tiles(q.num_tokens, !q.node_slots.empty());
  };
  int32_t nodes = 0;
  num_tiles_ = num_chunks_ = 0;
  for (const LinearSeq& q : seqs) {
    nodes += static_cast<int32_t>(q.node_slots.size());
    num_tiles_ += tiles_of(q);
    num_chunks_ += chunks_of(q);
  }
  const size_t bytes = static_cast<size_t>(5 * s + 3 + 2 * nodes) * sizeof(int32_t);
  const size_t act_bytes = static_cast<size_t>(num_tokens()) *
                           static_cast<size_t>(shape.conv_dim) * sizeof(float);
  const size_t ssd_bytes =
      static_cast<size_t>(kernels::cuda::ssd_scratch_floats(num_chunks_, shape.num_heads,
                                                            shape.head_dim, shape.state_size)) *
      sizeof(float);
  if (bytes > plan_capacity_ || act_bytes > act_capacity_ || ssd_bytes > ssd_capacity_) {
    platform_->synchronize_stream();  // queued kernels may still read the old buffers
    size_t device_capacity = plan_capacity_;
    grow(plan_host_, plan_capacity_, bytes, platform_->pinned_allocator());
    grow(plan_dev_, device_capacity, bytes, platform_->allocator());
    grow(act_, act_capacity_, act_bytes, platform_->allocator());
    grow(ssd_, ssd_capacity_, ssd_bytes, platform_->allocator());
  } else {
    plan_uploaded_->synchronize();  // the previous upload has read the staging buffer
  }
  auto* h = static_cast<int32_t*>(plan_host_.get());
  int32_t* seq_slot = h;
  int32_t* seq_start = seq_slot + s;
  int32_t* seq_nodes = seq_start + s + 1;
  int32_t* seq_tile = seq_nodes + s;
  int32_t* seq_chunk = seq_tile + s + 1;
  int32_t* node_slot = seq_chunk + s + 1;
  int32_t* node_parent = node_slot + nodes;
  int32_t row = 0, node = 0, tile = 0, chunk = 0;
  for (int32_t i = 0; i < s; ++i) {
    const LinearSeq& q = seqs[static_cast<size_t>(i)];
    seq_slot[i] = q.slot;
    seq_start[i] = row;
    seq_nodes[i] = q.node_slots.empty() ? -1 : node;
    seq_tile[i] = tile;
    tile += tiles_of(q);
    seq_chunk[i] = chunk;
    chunk += chunks_of(q);
    std::copy(q.node_slots.begin(), q.node_slots.end(), node_slot + node);
    std::copy(q.node_parents.begin(), q.node_parents.end(), node_parent + node);
    node += static_cast<int32_t>(q.node_slots.size());
    row += q.num_tokens;
  }
  seq_start[s] = row;
  seq_tile[s] = tile;
  seq_chunk[s] = chunk;
  platform_->copy_to_device_async(plan_dev_.get(), h, bytes);
  plan_uploaded_->record();
  num_seqs_ = s;
  num_nodes_ = nodes;
}

void CudaLinearBackend::run(const LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
                            const TensorView& y) {
  const attention::LinearShape& sh = layer.shape;
  const int64_t smem = kernels::cuda::linear_scan_smem_bytes(sh.head_dim, sh.state_size);
  PAGODA_REQUIRE(smem <= static_cast<int64_t>(platform_->capabilities().max_smem_per_block),
                 kUnsupported,
                 "linear-attention backend 'cuda': a head of {} x {} state needs {} bytes of "
                 "shared memory, the device has {}",
                 sh.head_dim, sh.state_size, smem, platform_->capabilities().max_smem_per_block);
  const auto* plan = static_cast<const int32_t*>(plan_dev_.get());
  kernels::cuda::LinearRecurrenceArgs a;
  a.xbc = xbc.data_as<const float>();
  a.xbc_stride = xbc.stride(0);
  a.dt = dt.data_as<const float>();
  a.dt_stride = dt.stride(0);
  a.y = y.data_as<float>();
  a.y_stride = y.stride(0);
  a.act = static_cast<float*>(act_.get());
  a.conv = layer.weights.conv;
  a.conv_bias = layer.weights.conv_bias;
  a.dt_bias = layer.weights.dt_bias;
  a.a_log = layer.weights.a_log;
  a.d = layer.weights.d;
  a.num_heads = sh.num_heads;
  a.head_dim = sh.head_dim;
  a.state_size = sh.state_size;
  a.num_groups = sh.num_groups;
  a.conv_kernel = sh.conv_kernel;
  a.dt_min = sh.dt_min;
  a.dt_max = sh.dt_max;
  a.states = pool().conv_state(layer.state_layer, 0);
  a.slot_stride = pool().slot_stride_floats();
  a.num_seqs = num_seqs_;
  a.seq_slot = plan;
  a.seq_start = plan + num_seqs_;
  a.seq_nodes = plan + 2 * num_seqs_ + 1;
  a.seq_tile = plan + 3 * num_seqs_ + 1;
  a.seq_chunk = plan + 4 * num_seqs_ + 2;
  a.node_slot = plan + 5 * num_seqs_ + 3;
  a.node_parent = a.node_slot + num_nodes_;
  a.num_tiles = num_tiles_;
  a.num_chunks = num_chunks_;
  a.chunk_states = static_cast<float*>(ssd_.get());
  kernels::cuda::launch_linear_recurrence(a, stream_).throw_if_error();
}

void register_cuda_linear_backend(attention::BackendRegistry& registry) {
  registry.add_linear("cuda",
                      "f32 Mamba2 on the GPU: causal conv, then the chunked SSD scan for "
                      "sequences of 16+ tokens and a per-token selective scan (one block per "
                      "sequence and head; state in shared memory) for decode, trees and short "
                      "extends",
                      CudaLinearBackend::static_capabilities(),
                      [](const attention::LinearBackendContext& ctx) {
                        return std::make_unique<CudaLinearBackend>(ctx);
                      });
}

}  // namespace pagoda::backends
