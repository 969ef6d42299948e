#!/usr/bin/env python3
"""Writes a Llama checkpoint whose weights are constructed (not trained) to copy: greedy decoding
continues any span that already occurred in the context, as a real model does on editing and
retrieval prompts. It gives speculative decoding a workload whose answers repeat their prompts
without downloading real weights (the device cannot reach a model hub), at the full cost of the
source layout: every tensor keeps its shape, so each forward does the same work as a trained model.

    python3 tools/make_copy_model.py --src /tmp/llama-1b --out /tmp/llama-1b-copy

--src is a Llama folder (tools/make_checkpoint.py --layout 1b): its config.json and tokenizer files
are copied, its weights are not read. The weights are an induction circuit of two layers:

  embedding  token t -> S unit vectors u[t, s] of c dims (one per slice s, random, seeded) in the
             residual's dims [0, S c), plus a constant 1 in the last dim (read by position-only
             queries and keys). c = 2 x the RoPE pairs that rotate by < 0.2 rad over
             --max-context positions (the "content" pairs): there a dot product ignores position.
  layer 0    previous-token heads: query and key are constants in the high-frequency RoPE pairs,
             phased so that q.k peaks at distance 1 (q k summed over pairs of frequency theta:
             A cos(theta (d - 1))); values copy the token's vectors, and o_proj writes them to the
             residual's dims [S c + pad, 2 S c + pad): each position then holds its predecessor.
  layer 1    induction heads, one per slice: the query is the current token's u[., s], the key is
             the predecessor's u[., s] (content pairs), so position j is found where x[j-1] equals
             the current token; its value u[x[j], s] is written, times GAIN, onto slice s of the
             token dims, where the tied unembedding reads it as the logit of x[j].
  all else   zero (o_proj and down_proj of every layer, the MLPs and layers 2..): residual
             pass-through; every norm weight is 1.

The tool checks its margins before writing (the previous-token score gap over all distances below
--max-context, the expected content-match gap), runs an independent float64 NumPy forward of the
two active layers on repeated spans of distinct random ids, prints the teacher-forced copy
accuracy, and fails (writing nothing) if it is below 0.99. Weights are saved as F16 (pagoda
converts them to its compute dtype: bf16 on CUDA). Needs numpy and safetensors (no torch).
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

ATTN_GAP_NATS = 14.0      # previous-token head: softmax logit gap between distance 1 and any other
MATCH_SCALE = 320.0       # induction heads: q.k of a perfect content match (before 1/sqrt(head_dim))
GAIN = 4.0                # induction output relative to the current token's own embedding


def rope_inv_freq(cfg):
    """HF's default / llama3 inverse frequencies (one per rotary pair)."""
    hd = cfg["head_dim"]
    # transformers >= 5 writes rope_parameters (rope_theta inside), older ones rope_scaling.
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    theta = (rs or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    f = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return f
    if kind != "llama3":
        raise SystemExit(f"rope_scaling type {kind!r} is not supported by this tool")
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    wl = 2 * math.pi / f
    out = np.where(wl > lo_wl, f / rs["factor"], f)
    smooth = (old / wl - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
    mid = ~(wl < hi_wl) & ~(wl > lo_wl)
    return np.where(mid, (1 - smooth) * out / rs["factor"] + smooth * out, out)


def read_config(src):
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    archs = cfg.get("architectures", [])
    if archs != ["LlamaForCausalLM"]:
        raise SystemExit(f"--src must be a LlamaForCausalLM checkpoint (architectures: {archs})")
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise SystemExit(f"{key} is not supported by this tool")
    return cfg


class Plan:
    """Dimensions and constants of the construction for one config."""

    def __init__(self, cfg, max_context):
        self.H = cfg["hidden_size"]
        self.hd = cfg["head_dim"]
        self.nq = cfg["num_attention_heads"]
        self.nkv = cfg["num_key_value_heads"]
        self.group = self.nq // self.nkv
        self.eps = cfg["rms_norm_eps"]
        self.V = cfg["vocab_size"]
        if cfg["num_hidden_layers"] < 2:
            raise SystemExit("the copy circuit needs at least 2 layers")
        half = self.hd // 2
        theta = rope_inv_freq(cfg)
        self.content_pairs = [i for i in range(half) if theta[i] * max_context <= 0.2]
        self.pos_pairs = [i for i in range(half) if theta[i] * max_context >= 8.0][:16]
        self.theta = theta
        self.c = 2 * len(self.content_pairs)                     # dims per slice
        self.S = self.nkv                                        # one induction head per kv head
        if self.c < 16:
            raise SystemExit(f"only {len(self.content_pairs)} RoPE pairs are position-free over "
                             f"{max_context} positions (need 8): lower --max-context")
        self.tok_dims = self.S * self.c
        self.prev_base = ((self.tok_dims + 63) // 64) * 64      # predecessor copy lives here
        self.const_dim = self.H - 1
        if self.prev_base + self.tok_dims > self.const_dim:
            raise SystemExit(f"hidden size {self.H} cannot hold 2 x {self.tok_dims} dims + 1")
        self.prev_kv_heads = (self.tok_dims + self.hd - 1) // self.hd  # kv heads carrying values
        if self.prev_kv_heads > self.nkv:
            raise SystemExit("not enough kv heads for the previous-token values")
        # Previous-token head: equal amplitude A on every position pair; the score gap between
        # distance 1 and the best other distance below max_context, per unit of A.
        d = np.arange(max_context, dtype=np.float64)
        th = theta[self.pos_pairs]
        score = np.cos(np.outer(d - 1.0, th)).sum(axis=1)
        others = np.delete(score, 1)
        self.pos_gap_per_amp = float(score[1] - others.max())
        if self.pos_gap_per_amp < 0.05:
            raise SystemExit("the high-frequency RoPE pairs cannot single out distance 1")
        self.pos_amp = ATTN_GAP_NATS * math.sqrt(self.hd) / self.pos_gap_per_amp
        # Content rotation over max_context, worst pair (cos of the largest angle).
        self.content_cos = float(math.cos(theta[self.content_pairs].max() * max_context))

    def rms(self, sq_sum):
        return math.sqrt(sq_sum / self.H + self.eps)


def unit_rows(rng, n, c):
    x = rng.standard_normal((n, c))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def build(cfg, plan, seed):
    """Returns {name: float32 array} for the whole checkpoint."""
    H, hd, nq, nkv, S, c = plan.H, plan.hd, plan.nq, plan.nkv, plan.S, plan.c
    half = hd // 2
    rng = np.random.default_rng(seed)
    L = cfg["num_hidden_layers"]
    inter = cfg["intermediate_size"]
    w = {}

    # Embedding: slices of unit vectors, the constant dim.
    E = np.zeros((plan.V, H), dtype=np.float32)
    for s in range(S):
        E[:, s * c:(s + 1) * c] = unit_rows(rng, plan.V, c)
    E[:, plan.const_dim] = 1.0
    w["model.embed_tokens.weight"] = E

    def content_rows(head):
        """Rows of a q/k projection that land on the content pairs of `head`, in order."""
        rows = []
        for i in plan.content_pairs:
            rows += [head * hd + i, head * hd + i + half]
        return rows

    for layer in range(L):
        p = f"model.layers.{layer}."
        q = np.zeros((nq * hd, H), np.float32)
        k = np.zeros((nkv * hd, H), np.float32)
        v = np.zeros((nkv * hd, H), np.float32)
        o = np.zeros((H, nq * hd), np.float32)
        if layer == 0:
            # The input's rms: S unit slices and the constant.
            n0 = plan.rms(S + 1.0)
            cst = 1.0 / n0                                   # the constant dim after the norm
            amp = math.sqrt(plan.pos_amp)
            for kvh in range(plan.prev_kv_heads):
                qh = kvh * plan.group                        # first q head of the group
                for i in plan.pos_pairs:
                    t = plan.theta[i]
                    # z_q = amp e^{-j theta}, z_k = amp: q.k = A cos(theta (d - 1)).
                    q[qh * hd + i, plan.const_dim] = amp * math.cos(-t) / cst
                    q[qh * hd + i + half, plan.const_dim] = amp * math.sin(-t) / cst
                    k[kvh * hd + i, plan.const_dim] = amp / cst
                # Values: token dims [kvh hd, kvh hd + hd) as they are before the norm.
                for j in range(hd):
                    src = kvh * hd + j
                    if src >= plan.tok_dims:
                        break
                    v[kvh * hd + j, src] = n0
                    o[plan.prev_base + src, qh * hd + j] = 1.0
        elif layer == 1:
            # Input: token slices (S), constant (1), the predecessor's slices (S).
            n1 = plan.rms(2 * S + 1.0)
            g = math.sqrt(MATCH_SCALE)
            for s in range(S):
                qh = s * plan.group
                for r, col in zip(content_rows(qh), range(s * c, (s + 1) * c)):
                    q[r, col] = g * n1
                for r, col in zip(content_rows(s), range(s * c, (s + 1) * c)):
                    k[r, plan.prev_base + col] = g * n1
                for j in range(c):
                    v[s * hd + j, s * c + j] = n1
                    o[s * c + j, qh * hd + j] = GAIN
        w[p + "self_attn.q_proj.weight"] = q
        w[p + "self_attn.k_proj.weight"] = k
        w[p + "self_attn.v_proj.weight"] = v
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "mlp.gate_proj.weight"] = np.zeros((inter, H), np.float32)
        w[p + "mlp.up_proj.weight"] = np.zeros((inter, H), np.float32)
        w[p + "mlp.down_proj.weight"] = np.zeros((H, inter), np.float32)
        w[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
    w["model.norm.weight"] = np.ones(H, np.float32)
    if not cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = E.copy()
    return w


# ---- independent float64 forward of the active layers (layers >= 2 are exact pass-through) ----

def rope(x, pos, theta):
    """x: [T, heads, hd] (HF rotate_half convention)."""
    half = x.shape[-1] // 2
    ang = np.outer(pos, theta)[:, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention_layer(h, w, layer, cfg, plan):
    p = f"model.layers.{layer}."
    T = h.shape[0]
    a = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + plan.eps)
    a = a * w[p + "input_layernorm.weight"]
    q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(T, plan.nq, plan.hd)
    k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(T, plan.nkv, plan.hd)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(T, plan.nkv, plan.hd)
    pos = np.arange(T, dtype=np.float64)
    q, k = rope(q, pos, plan.theta), rope(k, pos, plan.theta)
    out = np.zeros((T, plan.nq, plan.hd))
    mask = np.triu(np.ones((T, T), bool), 1)
    for hq in range(plan.nq):
        hk = hq // plan.group
        s = q[:, hq] @ k[:, hk].T / math.sqrt(plan.hd)
        s[mask] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(axis=1, keepdims=True)
        out[:, hq] = pr @ v[:, hk]
    return h + out.reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T


def check_copy(w, cfg, plan, seed, seq_len, id_range):
    """Teacher-forced argmax accuracy on the repeated part of repeated spans of distinct ids."""
    rng = np.random.default_rng(seed + 1)
    E = w["model.embed_tokens.weight"].astype(np.float64)
    W = {k_: v_.astype(np.float64) for k_, v_ in w.items() if ".layers.0." in k_ or
         ".layers.1." in k_}
    right = total = 0
    for span in (17, 61, 170):
        s = rng.choice(id_range, span, replace=False)  # distinct: one right answer per step
        x = np.concatenate([[cfg.get("bos_token_id", 0)], np.tile(s, seq_len // span + 1)])
        x = x[:seq_len]
        h = E[x]
        h = attention_layer(h, W, 0, cfg, plan)
        h = attention_layer(h, W, 1, cfg, plan)
        hn = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + plan.eps)
        pred = (hn @ E.T).argmax(axis=1)
        rep = slice(span + 1, seq_len - 1)                 # predictable: after the first copy
        right += int((pred[rep] == x[1:][rep]).sum())
        total += len(x[1:][rep])
    return right / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="Llama checkpoint folder (config, tokenizer)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-context", type=int, default=8192,
                    help="positions over which the circuit must hold (default 8192)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-len", type=int, default=400, help="length of the check sequences")
    ap.add_argument("--id-range", type=int, default=32000,
                    help="token ids of the check sequences (as pagoda bench draws them)")
    a = ap.parse_args()
    cfg = read_config(a.src)
    plan = Plan(cfg, a.max_context)
    print(f"slices {plan.S} x {plan.c} dims (content pairs {plan.content_pairs[0]}.."
          f"{plan.content_pairs[-1]}, worst cos over the context {plan.content_cos:.4f}); "
          f"position pairs {plan.pos_pairs[0]}..{plan.pos_pairs[-1]}, gap "
          f"{plan.pos_gap_per_amp:.3f} per unit amplitude -> amplitude {plan.pos_amp:.1f} "
          f"({ATTN_GAP_NATS} nats)", flush=True)
    w = build(cfg, plan, a.seed)
    acc = check_copy(w, cfg, plan, a.seed, a.check_len, min(a.id_range, plan.V))
    print(f"float64 check: teacher-forced copy accuracy {acc:.4f} on the repeated part", flush=True)
    if acc < 0.99:
        print("copy accuracy below 0.99: not writing the checkpoint", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    tensors = {k_: v_.astype(np.float16) for k_, v_ in w.items()}
    del w
    save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    cfg_out = dict(cfg)
    cfg_out["torch_dtype"] = "float16"
    cfg_out.pop("dtype", None)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg_out, fh, indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        if os.path.exists(os.path.join(a.src, f)):
            shutil.copy(os.path.join(a.src, f), os.path.join(a.out, f))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
