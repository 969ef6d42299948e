"""pagoda: paged attention kernels, KV cache and an offline engine, from Python.

Submodules:
  pagoda.flashinfer  -- a drop-in for FlashInfer 0.5's paged-attention API on pagoda's kernels
  pagoda.BatchAttention, pagoda.available_backends -- the kernels' own plan/run API
  pagoda.LLM, pagoda.SamplingParams -- the offline engine; pagoda.serve -- the HTTP server

Arrays cross into C++ through DLPack without copies: NumPy arrays on the CPU, torch tensors on
the CPU or CUDA. Outputs come back in the caller's framework.
"""
import os as _os

# The CPU engine's OpenMP threads wait passively (as the pagoda CLI runs them): spinning, they
# starve the caller's thread and OpenBLAS. Read once when libgomp loads, so set before
# _pagoda; an explicit OMP_WAIT_POLICY in the environment wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from pagoda._pagoda import BatchAttention, available_backends  # noqa: E402
from pagoda.llm import LLM, CompletionOutput, RequestOutput, SamplingParams, serve

__all__ = ["BatchAttention", "available_backends", "LLM", "SamplingParams", "RequestOutput",
           "CompletionOutput", "serve"]
