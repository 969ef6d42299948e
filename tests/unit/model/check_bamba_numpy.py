#!/usr/bin/env python3
"""CTest: pagoda's Bamba (BambaForCausalLM: Mamba2 layers beside attention layers) forward
against an independent NumPy float64 forward.

The checkpoint is tools/make_checkpoint.py's `bamba-tiny` (5 layers, attention at layers 1 and 3
with RoPE on the first half of each head, Mamba2 elsewhere: 8 heads in 2 groups, d_state 16,
d_conv 4, SSD chunks of 8 tokens), float32, random weights from the printed seed. It runs
`pagoda generate --dump-logits` on a batch of three requests (37, 9 and 20 prompt tokens, 8
output tokens each; the longest crosses several SSD chunks) with the reference backend (page 1),
the cpu backend (page 16) and the cpu backend with chunked prefill (chunks of 8 tokens, page 4:
every prompt's state is carried across calls), and checks, teacher-forced on pagoda's tokens:
  * every step's logits (the prefill's last row, then each decode step) equal the NumPy
    forward of the whole sequence within 1e-5 x max(1, max |logit|): prefill + decode through
    the state pool equals the full forward;
  * every greedy token is the NumPy argmax (where the top two are further apart than that);
  * the comparison sees each feature: the NumPy forward with one of them changed (RoPE on the
    whole head instead of its first half, the gated norm applied before the gate, head h
    reading group h % n_groups instead of h / (n_heads / n_groups), no conv bias, no D skip,
    the gated norm over all of d_inner instead of each of its n_groups groups)
    differs from pagoda by more than 100x the tolerance;
  * refusals name what they refuse: a Mamba2 tensor missing (the tensor), `--tp 2` and
    `--spec draft` (the hybrid state pool; n-gram speculation runs).
The NumPy forward is written from transformers' BambaForCausalLM equations with the Mamba2
recurrence run token by token (h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D
x_t), not from pagoda's C++ (which runs the chunked SSD form for prefill).

    check_bamba_numpy.py --pagoda build/pagoda --tool tools/make_checkpoint.py

Needs numpy and safetensors (scripts/setup.sh installs them). Prints the seed.
"""

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from logit_check import check, refused, run, setup  # noqa: E402

LAYOUT = "bamba-tiny"
FEATURES = ["partial_rope", "gate_order", "group_map", "conv_bias", "d_skip", "norm_groups"]


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def attention(cfg, g, p, hs, off):
    """One Bamba attention block (GQA, causal, RoPE on the first rotary_dim of each head)."""
    t, h = hs.shape
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // hq
    rot = d if "partial_rope" in off else d // 2
    a = p + "self_attn."
    q = (hs @ g[a + "q_proj.weight"].T).reshape(t, hq, d)
    k = (hs @ g[a + "k_proj.weight"].T).reshape(t, hkv, d)
    v = (hs @ g[a + "v_proj.weight"].T).reshape(t, hkv, d)
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]

    def rope(x):
        xr, xp = x[..., :rot], x[..., rot:]
        half = np.concatenate([-xr[..., rot // 2:], xr[..., :rot // 2]], axis=-1)
        return np.concatenate([xr * cos + half * sin, xp], axis=-1)

    q, k = rope(q), rope(k)
    causal = np.tril(np.ones((t, t), dtype=bool))
    o = np.empty((t, hq, d))
    for i in range(hq):
        j = i // (hq // hkv)
        s = np.where(causal, q[:, i] @ k[:, j].T * d ** -0.5, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        o[:, i] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, j]
    return o.reshape(t, hq * d) @ g[a + "o_proj.weight"].T


def mamba(cfg, g, p, hs, off):
    """One Bamba Mamba2 mixer, its recurrence token by token from a zero state."""
    t, h = hs.shape
    m = p + "mamba."
    nh, hd, n, grp = (cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_d_state"],
                      cfg["mamba_n_groups"])
    di, kw = nh * hd, cfg["mamba_d_conv"]
    proj = hs @ g[m + "in_proj.weight"].T
    if m + "in_proj.bias" in g:
        proj = proj + g[m + "in_proj.bias"]
    z, xbc, dt = proj[:, :di], proj[:, di:-nh], proj[:, -nh:]
    w = g[m + "conv1d.weight"][:, 0, :]  # [conv_dim, d_conv]
    padded = np.concatenate([np.zeros((kw - 1, xbc.shape[1])), xbc], axis=0)
    conv = sum(padded[j:j + t] * w[:, j] for j in range(kw))
    if m + "conv1d.bias" in g and "conv_bias" not in off:
        conv = conv + g[m + "conv1d.bias"]
    xbc = silu(conv)
    x = xbc[:, :di].reshape(t, nh, hd)
    b = xbc[:, di:di + grp * n].reshape(t, grp, n)
    c = xbc[:, di + grp * n:].reshape(t, grp, n)
    dt = softplus(dt + g[m + "dt_bias"])
    lo, hi = cfg.get("time_step_limit") or (0.0, None)
    dt = np.clip(dt, lo, hi if hi is not None else np.inf)
    a = -np.exp(g[m + "A_log"])
    dd = 0.0 if "d_skip" in off else g[m + "D"]
    group = [(i % grp) if "group_map" in off else i // (nh // grp) for i in range(nh)]
    b, c = b[:, group], c[:, group]  # [t, nh, n]: each head's group
    state = np.zeros((nh, hd, n))
    y = np.empty((t, nh, hd))
    for s in range(t):  # every head at once, one token at a time
        state = (np.exp(dt[s] * a)[:, None, None] * state +
                 (dt[s][:, None] * x[s])[:, :, None] * b[s][:, None, :])
        y[s] = np.einsum("hpn,hn->hp", state, c[s]) + np.reshape(dd, (-1, 1)) * x[s]
    y = y.reshape(t, di)
    eps = cfg["rms_norm_eps"]
    # The gated RMSNorm normalises each of n_groups equal groups of d_inner on its own
    # (mamba_ssm's RMSNormGated group_size = d_inner / ngroups; transformers' BambaRMSNormGated).
    ng = 1 if "norm_groups" in off else grp

    def norm(v):
        vg = v.reshape(t, ng, di // ng)
        vg = vg / np.sqrt(np.mean(vg * vg, axis=-1, keepdims=True) + eps)
        return vg.reshape(t, di) * g[m + "norm.weight"]

    if "gate_order" in off:  # norm, then gate
        y = norm(y) * silu(z)
    else:
        y = norm(y * silu(z))
    return y @ g[m + "out_proj.weight"].T


MEMO = {}  # the backends give the same tokens: each reference forward runs once


def forward(cfg, w, ids, off=frozenset()):
    """Logits [T, vocab] (float64) of the whole sequence; `off` names features changed."""
    key = (tuple(ids), off)
    if key not in MEMO:
        MEMO[key] = full_forward(cfg, w, ids, off)
    return MEMO[key]


def full_forward(cfg, w, ids, off):
    g = {k: v.astype(np.float64) for k, v in w.items()}
    eps = cfg["rms_norm_eps"]
    x = g["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        hs = rms_norm(x, g[p + "input_layernorm.weight"], eps)
        block = attention if l in cfg["attn_layer_indices"] else mamba
        x = x + block(cfg, g, p, hs, off)
        hs = rms_norm(x, g[p + "pre_ff_layernorm.weight"], eps)
        f = p + "feed_forward."
        gate, up = hs @ g[f + "gate_proj.weight"].T, hs @ g[f + "up_proj.weight"].T
        x = x + (silu(gate) * up) @ g[f + "down_proj.weight"].T
    head = g.get("lm_head.weight", g["model.embed_tokens.weight"])
    return rms_norm(x, g["model.final_layernorm.weight"], eps) @ head.T


def check_refusals(pagoda, out, tmp):
    """A missing Mamba2 tensor is refused naming it; --tp 2 and --spec draft naming the hybrid
    state pool."""
    from safetensors.numpy import load_file, save_file

    failures = 0
    w = load_file(os.path.join(out, "model.safetensors"))
    d = os.path.join(tmp, "no-D")
    os.makedirs(d)
    save_file({k: v for k, v in w.items() if k != "model.layers.2.mamba.D"},
              os.path.join(d, "model.safetensors"))
    with open(os.path.join(out, "config.json")) as f, open(os.path.join(d, "config.json"), "w") as o:
        o.write(f.read())
    cases = [("mamba.D missing", [pagoda, "generate", "--model", d, "--token-ids", "1,2"],
              "layers.2.mamba.D"),
             ("--tp 2", [pagoda, "generate", "--model", out, "--tp", "2", "--token-ids", "1,2"],
              "hybrid state pool"),
             ("--spec draft", [pagoda, "generate", "--model", out, "--spec", "draft",
                               "--token-ids", "1,2"], "hybrid state pool")]
    for name, cmd, needle in cases:
        failures += refused(cmd, needle, name)
    return failures


def main():
    a, tool, rng = setup()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, LAYOUT)
        cfg, w = tool.write_numpy_layout(LAYOUT, "f32", int(rng.integers(1 << 30)), out,
                                         tokenizer=False)
        prompts = [[cfg["bos_token_id"]] + rng.integers(3, 3900, n).tolist() for n in (36, 8, 19)]
        batch = os.path.join(out, "batch.txt")
        with open(batch, "w") as f:
            f.write("\n".join(",".join(map(str, p)) for p in prompts) + "\n")
        for backend, page, chunk in (("reference", 1, 0), ("cpu", 16, 0), ("cpu", 4, 8)):
            outs = run([a.pagoda, "generate", "--model", out, "--backend", backend,
                        "--page-size", str(page), "--chunk-size", str(chunk),
                        "--max-new-tokens", "8", "--ignore-eos", "--json", "--dump-logits",
                        "--batch-file", batch])
            label = f"{LAYOUT} {backend} page {page} chunk {chunk}"
            for i, got in enumerate(outs):
                feats = FEATURES if backend == "reference" and i == 0 else []
                failures += check(forward, cfg, w, prompts[i], got, f"{label} batch[{i}]", feats)
        failures += check_refusals(a.pagoda, out, tmp)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
