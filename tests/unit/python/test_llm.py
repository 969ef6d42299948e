"""pagoda.LLM / SamplingParams / pagoda.serve.

The oracle is a model whose right output is known without running one: tools/make_copy_model.py
constructs an induction circuit (Llama layout, GQA) whose greedy decoding continues any span that
already occurred in the context. The server is checked against LLM.generate on the builtin model
(two separate paths into the engine: HTTP + EngineLoop vs the offline API)."""
import json
import os
import subprocess
import sys
import urllib.request

import pytest

import pagoda
from pagoda import _pagoda

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
VOCAB, BOS, EOS = 4096, 4000, 4001
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "rope_theta": 500000.0, "bos_token_id": BOS, "eos_token_id": EOS, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("copy")
    src, out = d / "src", d / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_copy_model.py"), "--src",
                    str(src), "--out", str(out), "--max-context", "1024", "--seed", "7",
                    "--check-len", "200", "--id-range", "4000"], check=True,
                   capture_output=True)
    return str(out)


@pytest.mark.parametrize("page_size", [1, 16])
def test_generate_continues_the_copy(rng, copy_model, page_size):
    llm = pagoda.LLM(copy_model, backend="cpu", page_size=page_size, pool_tokens=8192)
    prompts, wants = [], []
    for _ in range(3):
        span = [int(x) for x in rng.choice(4000, size=int(rng.integers(120, 200)), replace=False)]
        cut = int(rng.integers(40, 100))
        prompts.append([BOS] + span + span[:cut])
        wants.append((span[cut:] + span)[:24])
    params = pagoda.SamplingParams(temperature=0, max_tokens=24)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert len(outs) == 3
    for out, prompt, want in zip(outs, prompts, wants):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == want
        assert out.outputs[0].finish_reason == "length"
    again = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.outputs[0].token_ids for o in again] == wants
    assert all(o.cached_tokens >= (len(p) - 1) // page_size * page_size - page_size
               for o, p in zip(again, prompts)), [o.cached_tokens for o in again]
    assert llm._engine.leaked_pages() == 0


def test_eos_finishes_with_stop(rng, copy_model):
    llm = pagoda.LLM(copy_model, backend="cpu", max_num_seqs=4)
    span = [int(x) for x in rng.choice(4000, size=150, replace=False)]
    cut = 60
    span[cut + 5] = EOS
    out = llm.generate(prompt_token_ids=[BOS] + span + span[:cut],
                       sampling_params={"temperature": 0, "max_new_tokens": 30})[0]
    ids = out.outputs[0].token_ids
    assert out.outputs[0].finish_reason == "stop"
    assert ids[:5] == span[cut:cut + 5] and len(ids) <= 6 and ids[-1] in (EOS, span[cut + 4])


def test_builtin_text_and_seeded_sampling():
    llm = pagoda.LLM("builtin")
    encode, decode = llm.get_tokenizer()
    params = pagoda.SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=5, max_tokens=12,
                                   ignore_eos=True)
    a = llm.generate(["Hello", "pagoda"], params)
    b = llm.generate(["Hello", "pagoda"], [params, params])
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    for o, text in zip(a, ["Hello", "pagoda"]):
        assert o.prompt == text and o.prompt_token_ids == encode(text, True)
        assert len(o.outputs[0].token_ids) == 12 and o.outputs[0].finish_reason == "length"
        assert o.outputs[0].text == decode(o.outputs[0].token_ids, True)


def test_kernel_options():
    # {name: value} reaches EngineArgs as `--kernel-option NAME=VALUE` would.
    args = _pagoda.EngineArgs()
    args.kernel_options = {"cpu_bf16": False, "sm90_max_blocks": 3}
    got = args.kernel_options
    assert got["cpu_bf16"] == "false" and got["sm90_max_blocks"] == "3"
    assert got["mla_decode"] == "true"  # the others keep their defaults
    llm = pagoda.LLM("builtin", kernel_options={"cpu_bf16": False})
    out = llm.generate(prompt_token_ids=[[1, 2, 3]],
                       sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="unknown kernel option 'sm90_tmaa'"):
        pagoda.LLM("builtin", kernel_options={"sm90_tmaa": 0})
    with pytest.raises(ValueError, match="merge_threads must be"):
        pagoda.LLM("builtin", kernel_options={"merge_threads": 48})


def test_linear_backend():
    # --linear-backend (a hybrid model's Mamba2 layers): EngineArgs carries it; pagoda.LLM takes
    # it, None meaning the attention backend's; an unknown name is refused by name.
    args = _pagoda.EngineArgs()
    assert args.linear_backend == ""
    args.linear_backend = "reference"
    assert args.linear_backend == "reference"
    out = pagoda.LLM("builtin", linear_backend="reference").generate(
        prompt_token_ids=[[1, 2, 3]],
        sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    pagoda.LLM("builtin", linear_backend=None)
    with pytest.raises(NotImplementedError, match="linear-attention backend 'nope'"):
        pagoda.LLM("builtin", linear_backend="nope")


def test_cpu_gemm():
    # pagoda's own engine argument (`--cpu-gemm`): a mode oneDNN runs everywhere, and a bad name.
    llm = pagoda.LLM("builtin", cpu_gemm="onednn-f32")
    out = llm.generate(prompt_token_ids=[[1, 2, 3]],
                       sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="--cpu-gemm must be"):
        pagoda.LLM("builtin", cpu_gemm="mkl")


def test_mla_prefill():
    # pagoda's own engine argument (`--mla-prefill`, MLA models' extend form): EngineArgs carries
    # it, pagoda.LLM takes it (a model without MLA runs unchanged), and a bad value is refused.
    args = _pagoda.EngineArgs()
    assert args.mla_prefill == "auto"
    out = pagoda.LLM("builtin", mla_prefill="absorbed").generate(
        prompt_token_ids=[[1, 2, 3]],
        sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="--mla-prefill 'fast'"):
        pagoda.LLM("builtin", mla_prefill="fast")
    # ... and its keys per window of the expanded form (`--mla-window-keys`).
    assert args.mla_window_keys == 0
    out = pagoda.LLM("builtin", mla_window_keys=64).generate(
        prompt_token_ids=[[1, 2, 3]],
        sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="--mla-window-keys -1"):
        pagoda.LLM("builtin", mla_window_keys=-1)


def test_kv_pool_sized_from_memory():
    # vLLM's kv_cache_memory_bytes (and SGLang's mem_fraction_static) size the pool instead of
    # pool_tokens; both kinds at once are refused by name.
    llm = pagoda.LLM("builtin", kv_cache_memory_bytes=4 << 20)
    out = llm.generate(prompt_token_ids=[[1, 2, 3]],
                       sampling_params=pagoda.SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="--pool-tokens"):
        pagoda.LLM("builtin", pool_tokens=4096, kv_cache_memory_bytes=4 << 20)
    with pytest.raises(ValueError, match="both size the KV pool"):
        pagoda.LLM("builtin", mem_fraction_static=0.5, gpu_memory_utilization=0.5)


def test_unsupported_arguments_are_named():
    with pytest.raises(NotImplementedError, match="tensor_parallel_size"):
        pagoda.LLM("builtin", tensor_parallel_size=2)
    with pytest.raises(NotImplementedError, match="quantization"):
        pagoda.LLM("builtin", quantization="awq")
    llm = pagoda.LLM("builtin", enable_prefix_caching=False, enforce_eager=True)
    for bad in ({"n": 2}, {"stop": ["\n"]}, {"repetition_penalty": 1.1}, {"logprobs": 1}):
        with pytest.raises(NotImplementedError, match=list(bad)[0]):
            llm.generate("hi", pagoda.SamplingParams(**bad))
    with pytest.raises(ValueError):
        llm.generate("hi", pagoda.SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate(prompt_token_ids=[[1, 2, 10**6]])
    # The engine arguments go through engine::make_engine_config, which names the flag.
    for kwargs, flag in (({"page_size": 0}, "--page-size"),
                         ({"schedule_policy": "lifo"}, "--policy"),
                         ({"kv_cache_dtype": "int4"}, "--kv-dtype"),
                         ({"chunked_prefill_size": 24}, "--chunk-size")):
        with pytest.raises(ValueError, match=flag):
            pagoda.LLM("builtin", **kwargs)


@pytest.mark.skipif(not hasattr(pagoda._pagoda, "serve"), reason="built without the server")
def test_serve_matches_offline_engine():
    code = "import pagoda, sys; sys.exit(pagoda.serve('builtin', port=0, backend='cpu'))"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        url = None
        for line in proc.stdout:
            if "listening on" in line:
                url = line.split("listening on")[1].split()[0]
                break
        assert url, "the server did not start"
        body = json.dumps({"model": "builtin", "prompt": "Hello", "max_tokens": 10,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            served = json.load(r)["choices"][0]["text"]
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    offline = pagoda.LLM("builtin", backend="cpu").generate(
        "Hello", pagoda.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert served == offline[0].outputs[0].text


def test_engine_seed_is_the_default_sampling_seed():
    params = pagoda.SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    a = pagoda.LLM("builtin", seed=11).generate("seeded", params)[0].outputs[0].token_ids
    b = pagoda.LLM("builtin").generate(
        "seeded", pagoda.SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True,
                                        seed=11))[0].outputs[0].token_ids
    c = pagoda.LLM("builtin", seed=12).generate("seeded", params)[0].outputs[0].token_ids
    assert a == b and a != c
