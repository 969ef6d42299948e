#!/usr/bin/env python3
"""CTest: pagoda's Gemma 2 and Gemma 3 (text) forward against an independent NumPy float64 forward.

For each family this writes a tiny random checkpoint (config.json + model.safetensors, Hugging
Face names and layout, float32) whose config switches every family feature on with values that
matter at this size: interleaved sliding / global layers (window 8 < the prompts), Gemma 3's own
local RoPE base and linear RoPE scaling on the global layers only, query/key RMSNorm, soft caps on
the attention scores and the final logits (Gemma 2), GeGLU, the sandwich norms, (1 + w) norms,
sqrt(hidden)-scaled embeddings, a tied (Gemma 3) and an untied (Gemma 2) head and
query_pre_attn_scalar != head_dim. It runs
`pagoda generate --dump-logits` (reference backend page 1, cpu backend page 16, and cpu page 4
with two tensor-parallel ranks; one request and a batch of three of different lengths) and checks, teacher-forced on pagoda's own tokens:
  * every generated step's logits equal the NumPy forward's within 1e-5 x max(1, max |logit|);
  * every greedy token is the NumPy argmax (where the top two are further apart than that);
  * the comparison sees each feature: the NumPy forward with one feature switched off differs
    from pagoda by more than 100x the tolerance.
The NumPy forward is written from the transformers modeling code's equations (full-sequence
attention with explicit masks), not from pagoda's C++.

    check_gemma_numpy.py --pagoda build/src/pagoda/cli/pagoda [--seed N]

Needs numpy and safetensors (scripts/setup.sh installs them). Prints the seed.
"""

import argparse
import json
import math
import os
import random
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from logit_check import check, run  # noqa: E402
from safetensors.numpy import save_file

COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, rms_norm_eps=1e-6,
              sliding_window=8, max_position_embeddings=4096, tie_word_embeddings=True,
              hidden_activation="gelu_pytorch_tanh", attention_bias=False, attention_dropout=0.0,
              bos_token_id=2, eos_token_id=1, pad_token_id=0, torch_dtype="float32")
CONFIGS = {
    "gemma2": dict(COMMON, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                   num_hidden_layers=4, rope_theta=10000.0, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0, cache_implementation="hybrid",
                   tie_word_embeddings=False),
    "gemma3_text": dict(COMMON, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                        num_hidden_layers=6, sliding_window_pattern=3, rope_theta=1e6,
                        rope_local_base_freq=100.0,
                        rope_scaling={"rope_type": "linear", "factor": 4.0},
                        final_logit_softcapping=None, attn_logit_softcapping=None),
}


def make_weights(cfg, rng):
    """HF-named float32 tensors: embedding N(0, 0.1^2), linears N(0, 1/in), norms w ~ N(0, 0.3^2)
    (the model scales by 1 + w)."""
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {"model.embed_tokens.weight": rng.normal(0, 0.1, (cfg["vocab_size"], h)),
         "model.norm.weight": rng.normal(0, 0.3, h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(0, h ** -0.5, (cfg["vocab_size"], h))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, h ** -0.5, (hq * d, h))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, h ** -0.5, (hkv * d, h))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, h ** -0.5, (hkv * d, h))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, (hq * d) ** -0.5, (h, hq * d))
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, h ** -0.5, (inter, h))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, h ** -0.5, (inter, h))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, inter ** -0.5, (h, inter))
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = rng.normal(0, 0.3, h)
        if cfg["model_type"] == "gemma3_text":
            w[p + "self_attn.q_norm.weight"] = rng.normal(0, 0.3, d)
            w[p + "self_attn.k_norm.weight"] = rng.normal(0, 0.3, d)
    # Stored as float32: the reference reads back exactly what pagoda reads.
    return {k: v.astype(np.float32) for k, v in w.items()}


def rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w.astype(np.float64))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_types(cfg):
    pattern = 2 if cfg["model_type"] == "gemma2" else cfg.get("sliding_window_pattern", 6)
    return ["sliding" if (i + 1) % pattern else "full" for i in range(cfg["num_hidden_layers"])]


def rope_tables(cfg, kind, positions, off):
    """cos/sin [T, D] of the rotate_half RoPE for a layer of `kind` ("sliding" or "full")."""
    d = cfg["head_dim"]
    gemma3 = cfg["model_type"] == "gemma3_text"
    if gemma3 and kind == "sliding" and "local_rope" not in off:
        theta, factor = cfg["rope_local_base_freq"], 1.0
    else:
        theta = cfg["rope_theta"]
        scaling = cfg.get("rope_scaling") or {}
        factor = scaling.get("factor", 1.0) if "rope_scaling" not in off else 1.0
    # transformers: inv_freq = 1 / theta ** (arange(0, d, 2).float() / d), in float32.
    expo = (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(np.float64)
    inv = 1.0 / theta ** expo / factor
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def forward(cfg, w, ids, off=frozenset()):
    """Logits [T, vocab] (float64) of the whole sequence `ids`; `off` names features switched
    off (to show the comparison depends on them)."""
    g = {k: v.astype(np.float64) for k, v in w.items()}
    h, d = cfg["hidden_size"], cfg["head_dim"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    t = len(ids)
    pos = np.arange(t)
    x = g["model.embed_tokens.weight"][ids] * (1.0 if "embed_scale" in off else math.sqrt(h))
    scale = (d if "query_pre_attn_scalar" in off else cfg["query_pre_attn_scalar"]) ** -0.5
    cap = cfg.get("attn_logit_softcapping") if "attn_softcap" not in off else None
    causal = pos[None, :] <= pos[:, None]
    window = pos[:, None] - pos[None, :] < cfg["sliding_window"]  # HF sliding_window_overlay
    for l, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{l}."
        a = rms_norm(x, g[p + "input_layernorm.weight"], eps)
        q = (a @ g[p + "self_attn.q_proj.weight"].T).reshape(t, hq, d)
        k = (a @ g[p + "self_attn.k_proj.weight"].T).reshape(t, hkv, d)
        v = (a @ g[p + "self_attn.v_proj.weight"].T).reshape(t, hkv, d)
        if p + "self_attn.q_norm.weight" in g and "qk_norm" not in off:
            q = rms_norm(q, g[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, g[p + "self_attn.k_norm.weight"], eps)
        cos, sin = rope_tables(cfg, kind, pos, off)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        mask = causal & window if kind == "sliding" and "window" not in off else causal
        o = np.empty((t, hq, d))
        for head in range(hq):
            kv = head // (hq // hkv)
            s = q[:, head] @ k[:, kv].T * scale
            if cap:
                s = np.tanh(s / cap) * cap
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            o[:, head] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv]
        o = o.reshape(t, hq * d) @ g[p + "self_attn.o_proj.weight"].T
        if "sandwich" not in off:
            o = rms_norm(o, g[p + "post_attention_layernorm.weight"], eps)
        x = x + o
        a = rms_norm(x, g[p + "pre_feedforward_layernorm.weight"], eps)
        gate = a @ g[p + "mlp.gate_proj.weight"].T
        act = gate / (1 + np.exp(-gate)) if "gelu" in off else gelu_tanh(gate)
        m = (act * (a @ g[p + "mlp.up_proj.weight"].T)) @ g[p + "mlp.down_proj.weight"].T
        if "sandwich" not in off:
            m = rms_norm(m, g[p + "post_feedforward_layernorm.weight"], eps)
        x = x + m
    head = g.get("lm_head.weight", g["model.embed_tokens.weight"])
    logits = rms_norm(x, g["model.norm.weight"], eps) @ head.T
    fcap = cfg.get("final_logit_softcapping") if "final_softcap" not in off else None
    if fcap:
        logits = np.tanh(logits / fcap) * fcap
    return logits


# Features whose removal must be visible, per family.
FEATURES = {
    "gemma2": ["window", "attn_softcap", "final_softcap", "sandwich", "gelu", "embed_scale",
               "query_pre_attn_scalar"],
    "gemma3_text": ["window", "qk_norm", "local_rope", "rope_scaling", "sandwich", "gelu",
                    "embed_scale", "query_pre_attn_scalar"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = np.random.default_rng(seed)
    failures = 0
    new_tokens = 5
    with tempfile.TemporaryDirectory() as tmp:
        for family, cfg in CONFIGS.items():
            out = os.path.join(tmp, family)
            os.makedirs(out)
            w = make_weights(cfg, rng)
            save_file(w, os.path.join(out, "model.safetensors"))
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            vocab = cfg["vocab_size"]
            prompts = [[cfg["bos_token_id"]] + rng.integers(3, vocab, n).tolist()
                       for n in (26, 9, 17)]
            batch = os.path.join(out, "batch.txt")
            with open(batch, "w") as f:
                f.write("\n".join(",".join(map(str, p)) for p in prompts) + "\n")
            for backend, page, tp in (("reference", 1, 1), ("cpu", 16, 1), ("cpu", 4, 2)):
                base = [a.pagoda, "generate", "--model", out, "--backend", backend,
                        "--page-size", str(page), "--tp", str(tp), "--max-new-tokens",
                        str(new_tokens), "--ignore-eos", "--json", "--dump-logits"]
                label = f"{family} {backend} page {page} tp {tp}"
                single = run(base + ["--token-ids", ",".join(map(str, prompts[0]))])[0]
                # The feature sweep once per family (it is the same reference each time).
                feats = FEATURES[family] if backend == "reference" else []
                failures += check(forward, cfg, w, prompts[0], single, label, feats)
                for i, got in enumerate(run(base + ["--batch-file", batch])):
                    failures += check(forward, cfg, w, prompts[i], got, f"{label} batch[{i}]",
                                      [])
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
