// The Mamba2 recurrence kernels (linear_params.h): the causal depthwise conv with its state,
// then the selective scan with the [head_dim, state_size] state in shared memory, one token at a
// time, for the sequences without SSD chunks (ssd_chunk_scan.cu runs the others). Tree verify:
// each node from its parent's state, written to its own slot.
#include "pagoda/kernels/cuda/linear_device.cuh"
#include "pagoda/kernels/cuda/linear_params.h"

namespace pagoda::kernels::cuda {
namespace {

using linear::conv_dim_of;
using linear::seq_of;
using linear::silu;
using linear::time_step;

constexpr int kConvThreads = 128;
constexpr int kScanThreads = 128;  // 4 warps; a warp owns rows p of the head's state
constexpr int kDefaultSmemBytes = 48 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// grid (num_tiles, ceil(conv_dim / kConvThreads)): thread = one channel of one tile of
/// kConvRows rows of one sequence (a tree: one tile, all its nodes).
__global__ void linear_conv_kernel(LinearRecurrenceArgs a) {
  const int cd = conv_dim_of(a);
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= cd) return;
  const int s = seq_of(a.seq_tile, a.num_seqs, blockIdx.x);
  const int tile = blockIdx.x - a.seq_tile[s];
  const int k = a.conv_kernel, past = k - 1;
  const float* w = a.conv + int64_t{c} * k;
  const float bias = a.conv_bias != nullptr ? a.conv_bias[c] : 0.f;
  const int row0 = a.seq_start[s], rows = a.seq_start[s + 1] - row0;
  const int nodes = a.seq_nodes[s];
  const int t0 = tile * kConvRows;
  // Channel c of a slot's conv state: row r (r-th oldest past input) at [r * cd].
  float* own = a.states + int64_t{a.seq_slot[s]} * a.slot_stride + c;
  if (nodes < 0) {
    // The window: the state's `past` rows (read by tile 0 only: t0 >= kConvRows >= past
    // otherwise), then the sequence's rows.
    auto in = [&](int i) {
      return i < past ? own[int64_t{i} * cd]
                      : a.xbc[int64_t{row0 + i - past} * a.xbc_stride + c];
    };
    const int t1 = min(rows, t0 + kConvRows);
    for (int t = t0; t < t1; ++t) {
      float acc = bias;
      for (int j = 0; j < k; ++j) acc += w[j] * in(t + j);  // input at time t - (k - 1) + j
      a.act[int64_t{row0 + t} * cd + c] = silu(acc);
    }
    // Tile 0, after its reads of the state: the last `past` inputs; ascending, so row rows + i
    // (> i) is read before it is written.
    if (tile == 0)
      for (int i = 0; i < past; ++i) own[int64_t{i} * cd] = in(rows + i);
    return;
  }
  for (int t = 0; t < rows; ++t) {
    const int parent = a.node_parent[nodes + t];
    const float* from =
        parent < 0 ? own : a.states + int64_t{a.node_slot[nodes + parent]} * a.slot_stride + c;
    float* to = a.states + int64_t{a.node_slot[nodes + t]} * a.slot_stride + c;
    const float x = a.xbc[int64_t{row0 + t} * a.xbc_stride + c];
    float acc = bias;
    for (int j = 0; j < past; ++j) acc += w[j] * from[int64_t{j} * cd];
    acc += w[past] * x;
    a.act[int64_t{row0 + t} * cd + c] = silu(acc);
    for (int i = 0; i + 1 < past; ++i) to[int64_t{i} * cd] = from[int64_t{i + 1} * cd];
    if (past > 0) to[int64_t{past - 1} * cd] = x;
  }
}

/// grid (num_seqs, num_heads), kScanThreads threads; dynamic shared memory
/// linear_scan_smem_bytes: h [P, N], then x [P], B [N], C [N] of the current token. Sequences
/// with SSD chunks return at once.
__global__ void linear_scan_kernel(LinearRecurrenceArgs a) {
  extern __shared__ float smem[];
  const int s = blockIdx.x, hd = blockIdx.y;
  const int p_dim = a.head_dim, n_dim = a.state_size, groups = a.num_groups;
  const int di = a.num_heads * p_dim, cd = conv_dim_of(a);
  const int g = hd / (a.num_heads / groups);
  const int pn = p_dim * n_dim;
  float* h = smem;
  float* x = h + pn;
  float* b = x + p_dim;
  float* c = b + n_dim;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
  if (a.seq_chunk[s + 1] > a.seq_chunk[s]) return;  // the chunked scan's sequence
  const int row0 = a.seq_start[s], rows = a.seq_start[s + 1] - row0;
  const int nodes = a.seq_nodes[s];
  const int64_t head = int64_t{a.conv_kernel - 1} * cd + int64_t{hd} * pn;  // in a slot's block
  auto state_of = [&](int slot) { return a.states + int64_t{slot} * a.slot_stride + head; };
  auto load = [&](const float* src) {
    for (int e = tid; e < pn; e += blockDim.x) h[e] = src[e];
  };
  auto store = [&](float* dst) {
    for (int e = tid; e < pn; e += blockDim.x) dst[e] = h[e];
  };
  const float a_neg = -expf(a.a_log[hd]);
  const float bias = a.dt_bias[hd], skip = a.d[hd];
  if (nodes < 0) load(state_of(a.seq_slot[s]));
  for (int t = 0; t < rows; ++t) {
    const int row = row0 + t;
    if (nodes >= 0) {  // the parent's state (written by this block before the last barrier)
      const int parent = a.node_parent[nodes + t];
      load(state_of(parent < 0 ? a.seq_slot[s] : a.node_slot[nodes + parent]));
    }
    const float* act = a.act + int64_t{row} * cd;
    for (int i = tid; i < p_dim; i += blockDim.x) x[i] = act[hd * p_dim + i];
    for (int i = tid; i < n_dim; i += blockDim.x) {
      b[i] = act[di + g * n_dim + i];
      c[i] = act[di + groups * n_dim + g * n_dim + i];
    }
    __syncthreads();
    const float delta =
        time_step(a.dt[int64_t{row} * a.dt_stride + hd], bias, a.dt_min, a.dt_max);
    const float decay = expf(delta * a_neg);
    for (int p = warp; p < p_dim; p += warps) {  // warp-uniform: every lane reaches warp_sum
      const float dx = delta * x[p];
      float acc = 0.f;
      for (int n = lane; n < n_dim; n += 32) {
        const float v = decay * h[p * n_dim + n] + dx * b[n];
        h[p * n_dim + n] = v;
        acc += v * c[n];
      }
      acc = warp_sum(acc);
      if (lane == 0) a.y[int64_t{row} * a.y_stride + hd * p_dim + p] = acc + skip * x[p];
    }
    __syncthreads();  // h complete; x, B, C free for the next token
    if (nodes >= 0) {
      store(state_of(a.node_slot[nodes + t]));
      __syncthreads();  // the node's state visible to the block before a child loads it
    }
  }
  if (nodes < 0) store(state_of(a.seq_slot[s]));
}

}  // namespace

namespace raw {

cudaError_t linear_recurrence(const LinearRecurrenceArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0) return cudaSuccess;
  const int cd = a.num_heads * a.head_dim + 2 * a.num_groups * a.state_size;
  const dim3 conv_grid(static_cast<unsigned>(a.num_tiles),
                       static_cast<unsigned>((cd + kConvThreads - 1) / kConvThreads));
  linear_conv_kernel<<<conv_grid, kConvThreads, 0, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t smem = linear_scan_smem_bytes(a.head_dim, a.state_size);
  if (smem > kDefaultSmemBytes) {
    e = cudaFuncSetAttribute(linear_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 scan_grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.num_heads));
  linear_scan_kernel<<<scan_grid, kScanThreads, static_cast<size_t>(smem), stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess || a.num_chunks == 0) return e;
  return ssd_chunk_scan(a, stream);
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
