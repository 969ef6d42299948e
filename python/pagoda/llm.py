"""The offline engine: pagoda.LLM(model, **engine_args).generate(prompts, SamplingParams(...)),
as users of vLLM's and SGLang's offline engines expect, over pagoda's C++ engine; and
pagoda.serve(...), which runs `pagoda serve` in this process.

Engine arguments (vLLM / SGLang spellings accepted where they mean the same thing):
  backend / attention_backend       attention backend ('cpu', 'reference', 'cuda', ...)
  linear_backend                    hybrid (Mamba2) models: the linear layers' backend ('cpu',
                                    'reference'; None / '' = the attention backend's)
  page_size                         KV page size in tokens (16)
  pool_tokens                       KV pool capacity in tokens (32768), or instead:
  mem_fraction_static / gpu_memory_utilization   weights + KV take this fraction of the
                                    device's memory (the host's RAM on the CPU)
  kv_cache_memory_bytes             the KV pools' bytes
  swa_full_tokens_ratio             SWA pool tokens per full-pool token when sized from memory
  max_mamba_cache_size              hybrid (Mamba2) models: state slots, running requests' and
                                    the radix cache's snapshots together (0 = 2 x max running,
                                    more at page_size > 1 and when speculating)
  max_num_seqs / max_running_requests    running requests (64)
  chunked_prefill_size              chunked prefill budget in tokens (0 = off)
  max_prefill_tokens                token budget of one prefill batch (8192)
  enable_prefix_caching / disable_radix_cache   radix prefix cache (on)
  enforce_eager / disable_cuda_graph    CUDA graphs of decode steps (on)
  mla_prefill                       MLA models' extend steps: 'auto' (expanded where it
                                    applies) or 'absorbed' (`--mla-prefill`)
  mla_window_keys                   keys per window of the expanded form (0: 1 GiB's worth;
                                    `--mla-window-keys`)
  overlap / disable_overlap_schedule    overlap scheduler (off; docs/design/engine.md)
  dtype, kv_cache_dtype             'auto', 'float32', 'float16', 'bfloat16', 'fp8_e4m3', ...
  max_model_len / context_length    longest request (0 = the model's)
  schedule_policy                   'fcfs' or 'lpm' (longest prefix match; fcfs)
  weight_seed                       the builtin model's random weights
  seed                              the sampling seed of requests whose SamplingParams.seed is None
  kernel_options                    {name: value} as `--kernel-option NAME=VALUE` (e.g.
                                    {"cpu_bf16": False}); ValueError naming an unknown name
Anything else raises NotImplementedError naming it (tensor_parallel_size > 1, quantization, ...).
"""
from dataclasses import dataclass, field
from typing import List, Optional, Union

from pagoda import _pagoda

_ARG_ALIASES = {
    "backend": "backend", "attention_backend": "backend", "linear_backend": "linear_backend",
    "page_size": "page_size",
    "pool_tokens": "pool_tokens", "max_num_seqs": "max_running",
    "max_running_requests": "max_running", "chunked_prefill_size": "chunk_size",
    "max_prefill_tokens": "max_prefill_tokens", "dtype": "dtype", "kv_cache_dtype": "kv_dtype",
    "max_model_len": "max_context_len", "context_length": "max_context_len",
    "schedule_policy": "policy", "overlap": "overlap", "cpu_gemm": "cpu_gemm",
    "mem_fraction_static": "mem_fraction_static", "gpu_memory_utilization": "mem_fraction_static",
    "kv_cache_memory_bytes": "kv_cache_memory", "swa_full_tokens_ratio": "swa_full_tokens_ratio",
    "max_mamba_cache_size": "max_mamba_cache_size", "mla_prefill": "mla_prefill",
    "mla_window_keys": "mla_window_keys",
}
# Engine arguments that size the KV pool from memory instead of pool_tokens.
_MEMORY_SIZING = ("mem_fraction_static", "gpu_memory_utilization", "kv_cache_memory_bytes")
# Arguments whose default (or a value meaning "the default") is accepted and changes nothing.
_NEUTRAL = {"tensor_parallel_size": 1, "tp_size": 1, "trust_remote_code": None,
            "tokenizer": None, "skip_tokenizer_init": False}


@dataclass
class SamplingParams:
    """Per-request sampling (vLLM's names; SGLang's max_new_tokens is accepted too).
    temperature 0 is greedy; top_k 0 or -1 disables top-k; seed None: the LLM's seed (0)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    max_new_tokens: Optional[int] = None
    ignore_eos: bool = False
    n: int = 1
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: Optional[int] = None
    skip_special_tokens: bool = True

    def _resolved(self, default_seed=0):
        """The engine tuple; NotImplementedError for what pagoda's sampler does not do."""
        for name, neutral in (("n", 1), ("stop", None), ("stop_token_ids", None),
                              ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                              ("repetition_penalty", 1.0), ("logprobs", None)):
            value = getattr(self, name)
            if value != neutral and not (name in ("stop", "stop_token_ids") and not value):
                raise NotImplementedError(f"SamplingParams.{name}={value!r} is not supported "
                                          "by pagoda's engine")
        max_new = self.max_new_tokens if self.max_new_tokens is not None else self.max_tokens
        if max_new is None:
            raise NotImplementedError("SamplingParams.max_tokens=None (until the context is "
                                      "full) is not supported: give a number")
        top_k = 0 if self.top_k in (-1, 0) else int(self.top_k)
        if top_k < 0:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        return (int(max_new), float(self.temperature), top_k, float(self.top_p),
                float(self.min_p), int(default_seed if self.seed is None else self.seed),
                bool(self.ignore_eos))


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: str  # "stop" (EOS), "length" (max_tokens or the context), "abort"


@dataclass
class RequestOutput:
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    finished: bool = True


class LLM:
    """An offline engine over one model: 'builtin' (a tiny random Llama with a byte tokenizer)
    or a Hugging Face checkpoint folder (Llama / Qwen2 / Mistral, safetensors)."""

    def __init__(self, model="builtin", **engine_args):
        args = _pagoda.EngineArgs()
        weight_seed = 0
        self._seed = 0
        for name, value in engine_args.items():
            if name in _ARG_ALIASES:
                target = _ARG_ALIASES[name]
                if target in ("dtype", "kv_dtype"):
                    value = "" if value in (None, "auto") else str(value).replace("torch.", "")
                elif target in ("backend", "linear_backend"):
                    value = value or ""
                elif value is None:
                    continue
                setattr(args, target, value)
            elif name == "enable_prefix_caching":
                args.radix_cache = bool(value)
            elif name == "disable_radix_cache":
                args.radix_cache = not value
            elif name == "enforce_eager":
                args.cuda_graph = not value
            elif name == "disable_cuda_graph":
                args.cuda_graph = not value
            elif name == "disable_overlap_schedule":
                args.overlap = not value
            elif name == "kernel_options":
                args.kernel_options = dict(value or {})
            elif name == "weight_seed":
                weight_seed = int(value)
            elif name == "seed":
                self._seed = 0 if value is None else int(value)
            elif name in _NEUTRAL and (value == _NEUTRAL[name] or
                                       (name == "tokenizer" and value == model)):
                continue
            else:
                raise NotImplementedError(f"pagoda.LLM: engine argument {name}={value!r} is "
                                          "not supported")
        given = [k for k in _MEMORY_SIZING if k in engine_args]
        if len(given) > 1:
            raise ValueError(f"pagoda.LLM: {' and '.join(given)} both size the KV pool: give one")
        if given and "pool_tokens" not in engine_args:
            args.pool_tokens = 0  # sized from memory; both given: the engine names the conflict
        self._engine = _pagoda.Engine(str(model), weight_seed, args)

    @property
    def backend(self):
        return self._engine.backend_name

    def get_tokenizer(self):
        """(encode, decode) callables of the model's tokenizer: encode(text, add_special_tokens)
        -> ids; decode(ids, skip_special_tokens) -> text (invalid UTF-8 replaced by U+FFFD)."""
        return self._engine.encode, self._decode

    def _decode(self, ids, skip_special_tokens=True):
        return self._engine.decode(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def generate(self, prompts=None, sampling_params=None, prompt_token_ids=None,
                 use_tqdm=False):
        """prompts: a string or list of strings, or prompt_token_ids (a list of ids, or a list
        of such lists); sampling_params: one SamplingParams (or SGLang-style dict) for all, or
        one per prompt. Returns one RequestOutput per prompt, in order."""
        texts, ids = self._prompts(prompts, prompt_token_ids)
        params = sampling_params if isinstance(sampling_params, list) else \
            [sampling_params] * len(ids)
        if len(params) != len(ids):
            raise ValueError(f"{len(ids)} prompts but {len(params)} sampling_params")
        params = [_as_params(p) for p in params]
        results = self._engine.generate(ids, [p._resolved(self._seed) for p in params])
        outs = []
        for text, prompt_ids, p, (out_ids, reason, cached, error) in zip(texts, ids, params,
                                                                         results):
            if reason == "error":
                raise RuntimeError(f"pagoda.LLM.generate: {error}")
            decoded = self._decode(out_ids, p.skip_special_tokens) \
                if self._engine.has_tokenizer else ""
            outs.append(RequestOutput(
                prompt=text, prompt_token_ids=list(prompt_ids),
                outputs=[CompletionOutput(0, decoded, list(out_ids),
                                          "length" if reason == "context" else reason)],
                cached_tokens=int(cached)))
        return outs

    def _prompts(self, prompts, prompt_token_ids):
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts and prompt_token_ids")
        if prompt_token_ids is not None:
            lists = prompt_token_ids
            if lists and isinstance(lists[0], int):
                lists = [lists]
            return [None] * len(lists), [list(map(int, x)) for x in lists]
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = []
        for p in prompts:
            if isinstance(p, dict):  # vLLM's TokensPrompt / TextPrompt
                if "prompt_token_ids" in p:
                    ids.append(list(p["prompt_token_ids"]))
                    continue
                p = p["prompt"]
            ids.append(self._engine.encode(p, True))
        return [p if isinstance(p, str) else None for p in prompts], ids


def _as_params(p):
    if p is None:
        return SamplingParams()
    if isinstance(p, SamplingParams):
        return p
    if isinstance(p, dict):
        return SamplingParams(**p)
    raise TypeError(f"sampling_params must be SamplingParams or a dict, got {type(p).__name__}")


_SERVE_ARGS = ("weight_seed", "served_model_name", "host", "port", "api_key", "max_queue",
               "chat_template", "drain_timeout_s")
# Engine settings of pagoda.serve (EngineArgs: `pagoda serve`'s engine flags).
_SERVE_ENGINE_ARGS = ("max_running", "backend", "linear_backend", "page_size", "pool_tokens",
                      "chunk_size", "max_prefill_tokens", "cuda_graph", "overlap", "radix_cache",
                      "mixed_batches", "max_context_len", "kernel_options")


def serve(model="builtin", *, dtype="auto", kv_cache_dtype="auto", policy="fcfs", **options):
    """Runs `pagoda serve` (the OpenAI-compatible server) in this process until SIGTERM /
    SIGINT and returns its exit status. Options as `pagoda serve`'s flags with underscores
    (host, port, api_key, max_queue, chat_template, drain_timeout_s, served_model_name,
    weight_seed; engine: max_running, backend, linear_backend, page_size, pool_tokens, chunk_size,
    max_prefill_tokens, cuda_graph, overlap, radix_cache, mixed_batches, max_context_len,
    kernel_options {name: value}); policy 'fcfs' or 'lpm'. Prints "pagoda serve: listening on
    http://HOST:PORT" once bound."""
    if not hasattr(_pagoda, "serve"):
        raise NotImplementedError("pagoda.serve: this build has no server (cpp-httplib was not "
                                  "found at configure time)")
    o = _pagoda.ServeOptions()
    o.model = str(model)
    engine = o.engine
    for name, value in options.items():
        if name in _SERVE_ARGS:
            setattr(o, name, value)
        elif name in _SERVE_ENGINE_ARGS:
            setattr(engine, name, value)
        else:
            raise NotImplementedError(f"pagoda.serve: option {name!r} is not supported")
    engine.policy = policy
    engine.dtype = "" if dtype in (None, "auto") else str(dtype)
    engine.kv_dtype = "" if kv_cache_dtype in (None, "auto") else str(kv_cache_dtype)
    o.engine = engine
    return _pagoda.serve(o)
