"""pagoda.flashinfer: FlashInfer 0.5's paged-attention API on pagoda's kernels.

    import pagoda.flashinfer as flashinfer

runs code written for FlashInfer unchanged where it uses the names below (same class, function and
argument names, defaults, shapes, NHD / HND layouts, plan() / run() split, return_lse, errors).
What pagoda cannot do raises NotImplementedError naming it. Tensors: NumPy arrays (CPU) or torch
tensors (CPU, CUDA); the workspace buffer's device picks pagoda's CPU or CUDA kernels.
LSE is base 2, as FlashInfer's. See docs/python.md for the covered and missing API.
"""
from pagoda.flashinfer.cascade import merge_state, merge_state_in_place, merge_states
from pagoda.flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from pagoda.flashinfer.mla import BatchMLAPagedAttentionWrapper
from pagoda.flashinfer.page import append_paged_kv_cache, get_batch_indices_positions
from pagoda.flashinfer.prefill import (BatchPrefillWithPagedKVCacheWrapper,
                                       BatchPrefillWithRaggedKVCacheWrapper,
                                       single_prefill_with_kv_cache)
from pagoda.flashinfer.quantization import packbits, segment_packbits
from pagoda.flashinfer.sampling import (min_p_sampling_from_probs, sampling_from_logits,
                                        sampling_from_probs, top_k_sampling_from_probs,
                                        top_k_top_p_sampling_from_logits,
                                        top_k_top_p_sampling_from_probs, top_p_sampling_from_probs)

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "BatchMLAPagedAttentionWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache", "merge_state", "merge_state_in_place", "merge_states",
    "append_paged_kv_cache", "get_batch_indices_positions", "packbits", "segment_packbits",
    "sampling_from_logits", "sampling_from_probs", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
]

# FlashInfer names pagoda does not provide: looking one up raises an error that names it. It is
# both a NotImplementedError (what pagoda cannot do) and an AttributeError (so hasattr() and
# feature checks see the name as absent).
_NOT_PROVIDED = (
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "BatchDecodeMlaWithPagedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper", "BatchPODWithPagedKVCacheWrapper",
    "BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper", "BatchAttention",
    "softmax", "top_p_renorm_probs", "top_k_renorm_probs", "top_k_mask_logits",
    "chain_speculative_sampling", "append_paged_mla_kv_cache", "trtllm_batch_decode_with_kv_cache",
    "xqa_batch_decode_with_kv_cache", "apply_rope", "apply_rope_inplace", "rmsnorm",
    "fused_add_rmsnorm", "silu_and_mul", "gelu_and_mul",
)


class NotProvidedError(NotImplementedError, AttributeError):
    """A FlashInfer name that pagoda.flashinfer does not provide."""


def __getattr__(name):
    if name in _NOT_PROVIDED:
        raise NotProvidedError(f"pagoda.flashinfer: {name} is not provided by pagoda "
                               "(see docs/python.md for the covered API)")
    raise AttributeError(f"module 'pagoda.flashinfer' has no attribute {name!r}")
