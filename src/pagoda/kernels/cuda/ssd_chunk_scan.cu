// The chunked SSD scan of Mamba2 (linear_params.h, step 3) for the sequences with chunks. Chunk
// c of a sequence covers its rows [c·L, min((c + 1)·L, rows)), L = kSsdChunk; in it, with
// Δ_i the time step of row i, cum_i = Σ_{j<=i} Δ_j·A (A = -exp(a_log)), and h_in the state
// entering the chunk:
//
//   y_i   = Σ_{j<=i} (C_i·B_j)·exp(cum_i - cum_j)·Δ_j·x_j  +  exp(cum_i)·(h_in·C_i)  +  D·x_i
//   h_out = exp(cum_L)·h_in  +  Σ_j exp(cum_L - cum_j)·Δ_j·x_j ⊗ B_j
//
// which is the token recurrence h = exp(Δ·A)·h + Δ·x ⊗ B, y = h·C + D·x unrolled over the
// chunk. Three launches:
//   1. ssd_chunk_state_kernel, grid (num_chunks, H): the chunk's own state
//      S_c = Σ_j exp(cum_L - cum_j)·Δ_j·x_j ⊗ B_j [P, N] into the scratch, and exp(cum_L);
//   2. ssd_state_pass_kernel, grid (P·N / 256, H): per state element and sequence with chunks,
//      sequentially over its chunks: h = the slot's state; per chunk S_c <- h (the state
//      entering it), h = exp(cum_L)·h + S_c; the final h into the slot;
//   3. ssd_chunk_output_kernel, grid (num_chunks, H): y from the entering state in the
//      scratch.
// The matrix products run as f32 FMA on 4 x 4 register tiles from shared memory (fma_tile),
// not on tensor cores: the layer's contract is f32 against an fp64 oracle at 2e-4, and bf16 or
// tf32 operands (8 or 10 mantissa bits) would miss it by one to two orders of magnitude.
#include "pagoda/kernels/cuda/linear_device.cuh"
#include "pagoda/kernels/cuda/linear_params.h"

namespace pagoda::kernels::cuda {
namespace {

using linear::conv_dim_of;
using linear::seq_of;
using linear::time_step;

constexpr int kL = kSsdChunk;
static_assert(kL == 64 && kSsdThreads == 256, "fma_tile's 16 x 16 threads cover 64 x 64");
constexpr int kPassThreads = 256;
/// Chunks whose scratch loads the state pass issues before it uses the first of them (the
/// chain through the chunks is one dependent FMA per chunk; the loads are not).
constexpr int kPassBatch = 8;

constexpr int round64(int v) { return (v + 63) / 64 * 64; }

/// The shared-memory layouts (floats), each array's offset; sizes in the kernels' comments.
struct StateSmem {  // chunk states: delta [L] | cum [L] | xwᵀ [P64, xs] | b [L, N64]
  int p64, n64;
  __host__ __device__ StateSmem(int p, int n) : p64(round64(p)), n64(round64(n)) {}
  __host__ __device__ int xs() const { return kL + 4; }  // padded as OutputSmem's rows
  __host__ __device__ int xw() const { return 2 * kL; }
  __host__ __device__ int b() const { return xw() + p64 * xs(); }
  __host__ __device__ int floats() const { return b() + kL * n64; }
};
struct OutputSmem {  // chunk outputs: delta [L] | cum [L] | c [L, cs] | u | x [L, P64] | g [L, gs]
  int p64, n64;
  __host__ __device__ OutputSmem(int p, int n) : p64(round64(p)), n64(round64(n)) {}
  // Row strides padded by 4 floats: the 2 rows a warp reads of c and g fall in different banks,
  // and the transposed stores into u spread over 8 banks.
  __host__ __device__ int cs() const { return n64 + 4; }
  __host__ __device__ int bs() const { return kL + 4; }   // u as Bᵀ [N64, bs]
  __host__ __device__ int hs() const { return p64 + 4; }  // u as h_inᵀ [N64, hs]
  __host__ __device__ int gs() const { return kL + 4; }
  __host__ __device__ int c() const { return 2 * kL; }
  __host__ __device__ int u() const { return c() + kL * cs(); }
  __host__ __device__ int x() const { return u() + n64 * (bs() > hs() ? bs() : hs()); }
  __host__ __device__ int g() const { return x() + kL * p64; }
  __host__ __device__ int floats() const { return g() + kL * gs(); }
};

/// The chunk a block of a (num_chunks, H) grid serves.
struct Chunk {
  int head, index;  ///< index: the chunk's place in the scratch
  int row0, len;    ///< its first row (of the call's T) and rows (1..L)
  int x, b, c;      ///< the columns of the head's x and its group's B and C in act
};
__device__ __forceinline__ Chunk chunk_of(const LinearRecurrenceArgs& a) {
  const int index = blockIdx.x, hd = blockIdx.y;
  const int s = seq_of(a.seq_chunk, a.num_seqs, index);
  const int c = index - a.seq_chunk[s];  // within the sequence
  const int rows = a.seq_start[s + 1] - a.seq_start[s];
  const int g = hd / (a.num_heads / a.num_groups);
  const int b = a.num_heads * a.head_dim + g * a.state_size;
  return {hd, index, a.seq_start[s] + c * kL, min(kL, rows - c * kL), hd * a.head_dim, b,
          b + a.num_groups * a.state_size};
}

/// The kernels' dynamic shared memory; both layouts start with delta [L] | cum [L].
__device__ __forceinline__ float* chunk_smem() {
  extern __shared__ float4 smem4[];
  return reinterpret_cast<float*>(smem4);
}

/// delta[i] = Δ of the chunk's row i and cum[i] = Σ_{j<=i} Δ_j·A for i < L (rows past len:
/// Δ = 0, so cum stays at cum[len - 1]), at the start of the shared memory. Block-wide: every
/// thread calls it (three barriers).
__device__ void chunk_time_steps(const LinearRecurrenceArgs& a, const Chunk& ch) {
  float* delta = chunk_smem();
  float* cum = delta + kL;
  const int i = threadIdx.x, lane = i % 32;
  float v = 0.f;
  if (i < kL) {  // whole warps
    const float dt = i < ch.len ? time_step(a.dt[int64_t{ch.row0 + i} * a.dt_stride + ch.head],
                                            a.dt_bias[ch.head], a.dt_min, a.dt_max)
                                : 0.f;
    v = dt * -expf(a.a_log[ch.head]);
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += up;
    }
    delta[i] = dt;
    cum[i] = v;
  }
  __syncthreads();
  if (i < kL)
    for (int w = 0; w < i / 32; ++w) v += cum[w * 32 + 31];  // the earlier warps' totals
  __syncthreads();
  if (i < kL) cum[i] = v;
  __syncthreads();
}

/// acc[r][v] += Σ_{k<kn} am[(i0 + 16r)·lda + k] · bm[k·ldb + q0 + v] for r, v < 4: thread
/// (i0, q0 / 4) of 16 x 16 threads (i0 = tid / 16, q0 = 4·(tid % 16)) accumulates its 4 x 4
/// tile of a 64 x 64 product; both operands in shared memory, rows 16-byte aligned (lda, ldb
/// and the offsets multiples of 4), kn a multiple of 4 (zero-padded past the data). Both
/// operands load as float4 (4 A rows x 4 k, then 4 B rows): 8 loads per 64 FMAs, so the FMA
/// pipe, not shared memory, bounds it.
__device__ __forceinline__ void fma_tile(float (&acc)[4][4], const float* am, int lda,
                                         const float* bm, int ldb, int kn) {
  const int i0 = threadIdx.x / 16, q0 = threadIdx.x % 16 * 4;
#pragma unroll 2
  for (int k = 0; k < kn; k += 4) {
    float4 av[4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
      av[r] = *reinterpret_cast<const float4*>(am + (i0 + 16 * r) * lda + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float4 b = *reinterpret_cast<const float4*>(bm + (k + kk) * ldb + q0);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float v = kk == 0 ? av[r].x : kk == 1 ? av[r].y : kk == 2 ? av[r].z : av[r].w;
        acc[r][0] += v * b.x;
        acc[r][1] += v * b.y;
        acc[r][2] += v * b.z;
        acc[r][3] += v * b.w;
      }
    }
  }
}

constexpr int round4(int v) { return (v + 3) / 4 * 4; }

__device__ __forceinline__ void zero(float (&acc)[4][4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[r][v] = 0.f;
}

/// grid (num_chunks, H), kSsdThreads threads, StateSmem: xwᵀ[p, i] = exp(cum_L - cum_i)·Δ_i·
/// x_i[p] and b[i, n] = B_i[n] (zero past len, P, N), then S_c = xwᵀ·b into the scratch
/// [index, head] ([P, N]) and exp(cum_L) into the decays after the states.
__global__ void __launch_bounds__(kSsdThreads) ssd_chunk_state_kernel(LinearRecurrenceArgs a) {
  const Chunk ch = chunk_of(a);
  chunk_time_steps(a, ch);
  const int p_dim = a.head_dim, n_dim = a.state_size, cd = conv_dim_of(a);
  const StateSmem lay(p_dim, n_dim);
  float* const delta = chunk_smem();
  float* const cum = delta + kL;
  float* const xw = delta + lay.xw();
  float* const b = delta + lay.b();
  const float last = cum[kL - 1];
  for (int e = threadIdx.x; e < kL * lay.p64; e += blockDim.x) {
    const int i = e / lay.p64, p = e % lay.p64;
    xw[p * lay.xs() + i] = i < ch.len && p < p_dim
                ? a.act[int64_t{ch.row0 + i} * cd + ch.x + p] * expf(last - cum[i]) * delta[i]
                : 0.f;
  }
  for (int e = threadIdx.x; e < kL * lay.n64; e += blockDim.x) {
    const int i = e / lay.n64, n = e % lay.n64;
    b[e] = i < ch.len && n < n_dim ? a.act[int64_t{ch.row0 + i} * cd + ch.b + n] : 0.f;
  }
  __syncthreads();
  const int64_t pn = int64_t{p_dim} * n_dim;
  float* out = a.chunk_states + (int64_t{ch.index} * a.num_heads + ch.head) * pn;
  const int i0 = threadIdx.x / 16, q0 = threadIdx.x % 16 * 4;
  for (int pb = 0; pb < lay.p64; pb += 64)
    for (int nb = 0; nb < lay.n64; nb += 64) {
      float acc[4][4];
      zero(acc);
      fma_tile(acc, xw + pb * lay.xs(), lay.xs(), b + nb, lay.n64, round4(ch.len));
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int p = pb + i0 + 16 * r, n = nb + q0 + v;
          if (p < p_dim && n < n_dim) out[int64_t{p} * n_dim + n] = acc[r][v];
        }
    }
  if (threadIdx.x == 0)
    a.chunk_states[int64_t{a.num_chunks} * a.num_heads * pn + int64_t{ch.index} * a.num_heads +
                   ch.head] = expf(last);
}

/// grid (ceil(P·N / kPassThreads), H): thread = one element e of head `hd`'s [P, N] state,
/// for each sequence with chunks in turn: h = the slot's state; per chunk, the chunk's own state
/// S_c is replaced by h (the state entering the chunk) and h = decay_c·h + S_c; the final h into
/// the slot.
__global__ void __launch_bounds__(kPassThreads) ssd_state_pass_kernel(LinearRecurrenceArgs a) {
  const int hd = blockIdx.y;
  const int64_t pn = int64_t{a.head_dim} * a.state_size;
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= pn) return;
  const int64_t head_stride = int64_t{a.num_heads} * pn;  // between consecutive chunks
  float* own = a.chunk_states + int64_t{hd} * pn + e;     // chunk c's S_c: own[c · head_stride]
  const float* decay = a.chunk_states + int64_t{a.num_chunks} * head_stride + hd;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int first = a.seq_chunk[s], end = a.seq_chunk[s + 1];
    if (first == end) continue;
    float* slot = a.states + int64_t{a.seq_slot[s]} * a.slot_stride +
                  int64_t{a.conv_kernel - 1} * conv_dim_of(a) + int64_t{hd} * pn + e;
    float h = *slot;
    for (int c0 = first; c0 < end; c0 += kPassBatch) {
      float part[kPassBatch], keep[kPassBatch];
#pragma unroll
      for (int k = 0; k < kPassBatch; ++k)
        if (c0 + k < end) {
          part[k] = own[(c0 + k) * head_stride];
          keep[k] = decay[int64_t{c0 + k} * a.num_heads];
        }
#pragma unroll
      for (int k = 0; k < kPassBatch; ++k)
        if (c0 + k < end) {
          own[(c0 + k) * head_stride] = h;
          h = keep[k] * h + part[k];
        }
    }
    *slot = h;
  }
}

/// grid (num_chunks, H), kSsdThreads threads, OutputSmem: c = C rows [L, N], u = Bᵀ
/// [N, L], x [L, P] (zero past len, P, N); g[i, j] = (C_i·B_j)·exp(cum_i - cum_j)·Δ_j for
/// j <= i (else 0); then u = h_inᵀ [N, P] (the entering state from the scratch) and
/// y_i = g·x + exp(cum_i)·(c·u)_i + D·x_i for i < len, p < P.
__global__ void __launch_bounds__(kSsdThreads) ssd_chunk_output_kernel(LinearRecurrenceArgs a) {
  const Chunk ch = chunk_of(a);
  chunk_time_steps(a, ch);
  const int p_dim = a.head_dim, n_dim = a.state_size, cd = conv_dim_of(a);
  const OutputSmem lay(p_dim, n_dim);
  float* const delta = chunk_smem();
  float* const cum = delta + kL;
  float* const c = delta + lay.c();
  float* const u = delta + lay.u();
  float* const x = delta + lay.x();
  float* const g = delta + lay.g();
  for (int e = threadIdx.x; e < kL * lay.n64; e += blockDim.x) {
    const int i = e / lay.n64, n = e % lay.n64;
    const bool in = i < ch.len && n < n_dim;
    const float* row = a.act + int64_t{ch.row0 + i} * cd;
    c[i * lay.cs() + n] = in ? row[ch.c + n] : 0.f;
    u[n * lay.bs() + i] = in ? row[ch.b + n] : 0.f;
  }
  for (int e = threadIdx.x; e < kL * lay.p64; e += blockDim.x) {
    const int i = e / lay.p64, p = e % lay.p64;
    x[e] = i < ch.len && p < p_dim ? a.act[int64_t{ch.row0 + i} * cd + ch.x + p] : 0.f;
  }
  __syncthreads();
  const int i0 = threadIdx.x / 16, q0 = threadIdx.x % 16 * 4;
  {
    float acc[4][4];
    zero(acc);
    fma_tile(acc, c, lay.cs(), u, lay.bs(), lay.n64);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int i = i0 + 16 * r, j = q0 + v;
        g[i * lay.gs() + j] = j <= i ? acc[r][v] * expf(cum[i] - cum[j]) * delta[j] : 0.f;
      }
  }
  __syncthreads();  // every read of Bᵀ done: u becomes h_inᵀ
  const int64_t pn = int64_t{p_dim} * n_dim;
  const float* h_in = a.chunk_states + (int64_t{ch.index} * a.num_heads + ch.head) * pn;
  for (int e = threadIdx.x; e < lay.p64 * lay.n64; e += blockDim.x) {
    const int p = e / lay.n64, n = e % lay.n64;
    u[n * lay.hs() + p] = p < p_dim && n < n_dim ? h_in[int64_t{p} * n_dim + n] : 0.f;
  }
  __syncthreads();
  const float skip = a.d[ch.head];
  for (int pb = 0; pb < lay.p64; pb += 64) {
    float intra[4][4], enter[4][4];
    zero(intra);
    zero(enter);
    fma_tile(intra, g, lay.gs(), x + pb, lay.p64, round4(ch.len));
    fma_tile(enter, c, lay.cs(), u + pb, lay.hs(), lay.n64);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = i0 + 16 * r;
      if (i >= ch.len) continue;
      const float from_start = expf(cum[i]);
      float* y = a.y + int64_t{ch.row0 + i} * a.y_stride + ch.x;
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int p = pb + q0 + v;
        if (p < p_dim)
          y[p] = intra[r][v] + from_start * enter[r][v] + skip * x[i * lay.p64 + p];
      }
    }
  }
}

cudaError_t set_smem(const void* kernel, int64_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace

int64_t ssd_chunk_smem_bytes(int head_dim, int state_size) {
  const int64_t state = StateSmem(head_dim, state_size).floats();
  const int64_t output = OutputSmem(head_dim, state_size).floats();
  return (state > output ? state : output) * int64_t{sizeof(float)};
}

namespace raw {

cudaError_t ssd_chunk_scan(const LinearRecurrenceArgs& a, cudaStream_t stream) {
  const int64_t state_smem = StateSmem(a.head_dim, a.state_size).floats() * int64_t{4};
  const int64_t output_smem = OutputSmem(a.head_dim, a.state_size).floats() * int64_t{4};
  cudaError_t e = set_smem(reinterpret_cast<const void*>(ssd_chunk_state_kernel), state_smem);
  if (e == cudaSuccess)
    e = set_smem(reinterpret_cast<const void*>(ssd_chunk_output_kernel), output_smem);
  if (e != cudaSuccess) return e;
  const dim3 chunks(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.num_heads));
  ssd_chunk_state_kernel<<<chunks, kSsdThreads, static_cast<size_t>(state_smem), stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const int64_t pn = int64_t{a.head_dim} * a.state_size;
  const dim3 pass(static_cast<unsigned>((pn + kPassThreads - 1) / kPassThreads),
                  static_cast<unsigned>(a.num_heads));
  ssd_state_pass_kernel<<<pass, kPassThreads, 0, stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  ssd_chunk_output_kernel<<<chunks, kSsdThreads, static_cast<size_t>(output_smem), stream>>>(a);
  return cudaGetLastError();
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
