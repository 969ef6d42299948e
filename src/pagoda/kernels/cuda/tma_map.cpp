/// Tensor maps of the paged caches and of attention outputs (tma_map.h).

#include "pagoda/kernels/cuda/tma_map.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <algorithm>

namespace pagoda::kernels::cuda::raw {
namespace {

/// The driver's cuTensorMapEncodeTiled through the runtime; nullptr when the driver does not
/// have it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

/// The tensor-map type and bytes of elements of type t: 16-bit floats, or e4m3 as bytes (a
/// copy moves them unchanged); false for other types.
bool map_type(ElemType t, CUtensorMapDataType& type, cuuint64_t& bytes) {
  switch (t) {
    case ElemType::kBF16:
      type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
      bytes = 2;
      return true;
    case ElemType::kF16:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      bytes = 2;
      return true;
    case ElemType::kE4M3:
      type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
      bytes = 1;
      return true;
    default:
      return false;
  }
}

/// A tensor of `type` elements at `data` with `rank` dims (innermost first; unit innermost
/// stride, byte strides of the others), boxes of `box` under the 128-byte swizzle.
bool encode_swizzled(CUtensorMap& map, CUtensorMapDataType type, cuuint32_t rank, void* data,
                     const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                     CUtensorMapL2promotion l2) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(&map, type, rank, data, dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool encode_paged_map(CUtensorMap& map, const PagedCache& c, ElemType t, int head_dim, int heads,
                      int page_size, int rows) {
  CUtensorMapDataType type{};
  cuuint64_t e = 0;  // bytes per element
  if (c.num_pages <= 0 || !map_type(t, type, e)) return false;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(page_size),
                              cuuint64_t(c.num_pages)};
  const cuuint64_t strides[3] = {cuuint64_t(c.head_stride) * e, cuuint64_t(c.token_stride) * e,
                                 cuuint64_t(c.page_stride) * e};
  const cuuint32_t box[4] = {cuuint32_t(128 / e), 1, cuuint32_t(rows), 1};  // 128 bytes
  return encode_swizzled(map, type, 4, const_cast<void*>(c.data), dims, strides, box,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

bool encode_out_map(CUtensorMap& map, void* out, ElemType t, int head_dim, int heads,
                    int64_t tokens, int64_t stride_n, int64_t stride_h, int box_heads,
                    int box_tokens) {
  CUtensorMapDataType type{};
  cuuint64_t e = 0;  // bytes per element
  if (out == nullptr || tokens <= 0 || head_dim % 64 != 0 || !map_type(t, type, e) || e != 2) {
    return false;
  }
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(stride_h) * e, cuuint64_t(stride_n) * e};
  const cuuint32_t box[3] = {64, cuuint32_t(box_heads), cuuint32_t(box_tokens)};
  return encode_swizzled(map, type, 3, out, dims, strides, box, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

int box_rows_for_page(int page_size, int keys) {
  const int rows = std::min(page_size, keys);
  return rows >= 16 && page_size % rows == 0 && keys % rows == 0 ? rows : 0;
}

int paged_box_rows(const PagedCache& c, int page_size, int keys) {
  return c.head_stride > c.token_stride ? 0 : box_rows_for_page(page_size, keys);
}

}  // namespace pagoda::kernels::cuda::raw
