#pragma once
/// Host side of the Hopper kernels' TMA copies: the paged K / V / latent cache as a 4-D tensor
/// map, and an attention output as a 3-D one (no link to libcuda: the driver's encoder is
/// reached through the runtime).

#include <cuda.h>

#include "pagoda/kernels/cuda/attention_params.h"

namespace pagoda::kernels::cuda::raw {

/// Encodes the paged cache `c` (elements of type `t`: bf16 / f16, or e4m3 as bytes) as a 4-D
/// tensor with dims (d < head_dim, head < heads, token < page_size, page < c.num_pages) and
/// boxes of {128 bytes of elements (64 16-bit, 128 e4m3), 1 head, `rows` tokens, 1 page} under
/// the 128-byte swizzle: one box is `rows` keys x one 128-byte atom column of a head, laid out as
/// the kernels' cp.async gathers lay it (sw128_offset); a box past head_dim is zero-filled. False
/// when the driver has no encoder or refuses the layout (the caller then copies by cp.async). Never
/// throws; leaves no CUDA error behind.
bool encode_paged_map(CUtensorMap& map, const PagedCache& c, ElemType t, int head_dim, int heads,
                      int page_size, int rows);

/// Encodes an attention output (16-bit elements of type `t` at `out`; element strides
/// `stride_n` per token and `stride_h` per head, unit inner stride) as a 3-D tensor with dims
/// (d < head_dim, head < heads, token < tokens) and boxes of {64 elements, `box_heads` heads,
/// `box_tokens` tokens} under the 128-byte swizzle: one box is box_heads x box_tokens rows of one
/// 128-byte atom column, token-major (the packed-row order of the sm90 prefill's staged output).
/// False when the driver has no encoder or refuses the layout (16-byte aligned base and strides
/// needed). Never throws; leaves no CUDA error behind.
bool encode_out_map(CUtensorMap& map, void* out, ElemType t, int head_dim, int heads,
                    int64_t tokens, int64_t stride_n, int64_t stride_h, int box_heads,
                    int box_tokens);

/// The rows of the boxes a kernel with tiles of `keys` keys can copy a cache of this page size
/// with: min(page_size, keys) where that divides both and is >= 16 (a box's rows start at a
/// 1024-byte boundary of the swizzle pattern only from 8 rows up; 16 keeps the boxes few), and
/// the page's heads sit inside its token rows (head stride <= token stride, the pool's layout);
/// else 0 (no TMA).
int paged_box_rows(const PagedCache& c, int page_size, int keys);
/// The page-size part of paged_box_rows(): min(page_size, keys) where that is >= 16 and divides
/// both, else 0 (for a planner that has no cache view yet).
int box_rows_for_page(int page_size, int keys);

}  // namespace pagoda::kernels::cuda::raw
