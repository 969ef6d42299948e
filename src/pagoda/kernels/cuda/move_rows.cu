#include "pagoda/kernels/cuda/move_rows.h"

namespace pagoda::kernels::cuda {
namespace {

// One row of `words` Words copied by the block (both kernels below: one block per row).
template <typename Word>
__device__ void copy_row(Word* dst, const Word* src, int64_t words) {
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

// Threads per block for rows of `words` Words: a multiple of 32, at most 256.
unsigned row_threads(int64_t words) {
  return static_cast<unsigned>(words >= 256 ? 256 : (words + 31) / 32 * 32);
}

// One block per (pair, buffer); 16-byte words when every row start is 16-byte aligned, else
// bytes. gather: row src[i] of buffer b -> scratch[(b * n + i) * row]; scatter: the reverse into
// row dst[i].
template <typename Word, bool kGather>
__global__ void move_rows_kernel(MoveRowsArgs a) {
  const int i = blockIdx.x, b = blockIdx.y;
  const int64_t words = a.row_bytes / static_cast<int64_t>(sizeof(Word));
  auto* base = reinterpret_cast<unsigned char*>(a.bases[b]);
  Word* scratch = reinterpret_cast<Word*>(
      a.scratch + (static_cast<int64_t>(b) * a.num_pairs + i) * a.row_bytes);
  Word* row = reinterpret_cast<Word*>(
      base + static_cast<int64_t>(kGather ? a.src[i] : a.dst[i]) * a.row_bytes);
  if constexpr (kGather) {
    copy_row(scratch, row, words);
  } else {
    copy_row(row, scratch, words);
  }
}

template <typename Word>
cudaError_t launch_both(const MoveRowsArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.num_pairs), static_cast<unsigned>(a.num_bases));
  const unsigned threads = row_threads(a.row_bytes / static_cast<int64_t>(sizeof(Word)));
  move_rows_kernel<Word, true><<<grid, threads, 0, s>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  move_rows_kernel<Word, false><<<grid, threads, 0, s>>>(a);
  return cudaGetLastError();
}

// One block per gathered row.
template <typename Word>
__global__ void gather_rows_kernel(GatherRowsArgs a) {
  const int i = blockIdx.x;
  copy_row(reinterpret_cast<Word*>(a.dst + static_cast<int64_t>(i) * a.row_bytes),
           reinterpret_cast<const Word*>(a.src + static_cast<int64_t>(a.rows[i]) * a.row_bytes),
           a.row_bytes / static_cast<int64_t>(sizeof(Word)));
}

template <typename Word>
cudaError_t launch_gather(const GatherRowsArgs& a, cudaStream_t s) {
  const unsigned threads = row_threads(a.row_bytes / static_cast<int64_t>(sizeof(Word)));
  gather_rows_kernel<Word><<<static_cast<unsigned>(a.n), threads, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace

namespace raw {

cudaError_t gather_rows(const GatherRowsArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.row_bytes == 0) return cudaSuccess;
  const bool words16 = a.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.src) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.dst) % 16 == 0;
  return words16 ? launch_gather<uint4>(a, stream) : launch_gather<unsigned char>(a, stream);
}

cudaError_t move_rows(const MoveRowsArgs& a, cudaStream_t stream) {
  if (a.num_bases == 0 || a.num_pairs == 0 || a.row_bytes == 0) return cudaSuccess;
  // 16-byte words when rows (so every row start) are multiples of 16 bytes; the buffers come
  // from the allocator (256-byte aligned).
  return a.row_bytes % 16 == 0 ? launch_both<uint4>(a, stream)
                               : launch_both<unsigned char>(a, stream);
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
