"""pagoda: paged attention kernels, KV cache and an offline engine, from Python.

Submodules:
  pagoda.flashinfer  -- a drop-in for FlashInfer 0.5's paged-attention API on pagoda's kernels
  pagoda.BatchAttention, pagoda.available_backends -- the kernels' own plan/run API
  pagoda.LLM, pagoda.SamplingParams -- the offline engine; pagoda.serve -- the HTTP server

Arrays cross into C++ through DLPack without copies: NumPy arrays on the CPU, torch tensors on
the CPU or CUDA. Outputs come back in the caller's framework.
"""
from pagoda._pagoda import BatchAttention, available_backends
from pagoda.llm import LLM, CompletionOutput, RequestOutput, SamplingParams, serve

__all__ = ["BatchAttention", "available_backends", "LLM", "SamplingParams", "RequestOutput",
           "CompletionOutput", "serve"]
