#!/usr/bin/env python3
"""Writes a random Hugging Face checkpoint of a named layout, for benchmarks and tests.

    python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 --out /tmp/llama-1b

Layouts (the shapes of real models, random weights):
  tiny          LlamaForCausalLM, hidden 256, 4 layers, 4 q / 2 kv heads of 64, vocab 4096
  qwen2-tiny    Qwen2ForCausalLM (q/k/v biases), tied embeddings, theta 1e6, same small shapes
  mistral-tiny  MistralForCausalLM with a 32-token sliding window, same small shapes
  gemma2-tiny   Gemma2ForCausalLM: alternating 32-token sliding / global layers, attention and
                final soft caps, GeGLU, sandwich norms, tied; hidden 256, 4 layers
  gemma3-tiny   Gemma3ForCausalLM (gemma3_text): 2 sliding (32 tokens, local RoPE base 10000) :
                1 global layer (theta 1e6, linear scaling x8), q/k norms; hidden 256, 6 layers
  gemma3-1b     the Gemma-3-1B text layout (26 layers, 5 local : 1 global, window 512, 1 KV
                head of 256, vocab 262144)
  1b            the Llama-3.2-1B layout (1.24 B parameters, tied, llama3 rope scaling x32)
  8b            the Llama-3.1-8B layout (8.0 B parameters, untied, llama3 rope scaling x8)
  qwen2-0.5b    the Qwen2.5-0.5B layout (q/k/v biases, tied, vocab 151936)
  deepseek-v2-tiny  DeepseekV2ForCausalLM, dense MLP (n_routed_experts 8 but
                first_k_dense_replace = all 3 layers, as transformers' config requires an
                int): MLA without q LoRA (kv_lora_rank 64, qk nope 32 / rope 16, v 32), 4
                heads, hidden 256, 3 layers, no RoPE scaling
  deepseek-v3-tiny  DeepseekV3ForCausalLM, dense MLP (n_routed_experts 8 but
                first_k_dense_replace = all 3 layers): MLA with q LoRA (q_lora_rank 96,
                kv_lora_rank 64, nope 32 / rope 16, v 24), YaRN (factor 4 over 32 original
                positions, mscale 0.8 / mscale_all_dim 0.6, so both the cos/sin scale and the
                softmax mscale differ from 1)
  deepseek-v2-lite  DeepSeek-V2-Lite's attention at real size with a dense MLP (issue 50's
                engine layout: MoE is not implemented): 27 layers, hidden 2048, 16 heads, MLA
                without q LoRA (kv_lora_rank 512, qk nope 128 / rope 64, v 128), YaRN (factor
                40 over 4096, mscale 0.707 / 0.707), MLP 10944 in every layer
                (first_k_dense_replace 27), vocab 102400, untied (2.6 B parameters)
  deepseek-v2-lite-narrow  deepseek-v2-lite's attention (hidden 2048, 16 heads, the same MLA and
                YaRN) in 4 layers with MLP 1024 and vocab 4096: the MLA prefill forms' CPU
                A/B (--mla-prefill), 0.1 B parameters
  deepseek-v32-tiny  DeepseekV32ForCausalLM: deepseek-v3-tiny plus DeepSeek sparse attention
                (a lightning indexer per layer: 4 index heads of dim 32, index_topk 16, so
                prompts past 16 tokens attend sparsely)
  bamba-tiny    BambaForCausalLM: 5 layers, attention at layers 1 and 3 (4 q / 2 kv heads of 32,
                RoPE on the first half of each head), Mamba2 elsewhere (8 heads of 32, d_state
                16, 2 groups, d_conv 4, SSD chunks of 8, conv bias), hidden 128, vocab 4096
  bamba-1b      Bamba-9B's Mamba2 mixer (heads of 64, d_state 128, 1 group, d_conv 4, SSD chunks
                of 256, expand 2) at hidden 2048: 16 layers, attention at 5 and 11 (16 q / 4 kv
                heads of 128), MLP 7168, vocab 32000, 131072 positions (1.2 B parameters; the
                GPU benchmarks of bench/device/run.sh's hybrid group)
  bamba-small   the same mixer head (64 x d_state 128, 1 group) at hidden 256: 6 layers,
                attention at 2 (4 q / 2 kv heads of 64), MLP 512, vocab 4096, 131072 positions
                (the hybrid group's CPU runs)
  gemma3-1b-narrow  Gemma-3-1B's attention layout (26 layers, 5 local : 1 global, window 512,
                4 q / 1 KV head of 256, so the same KV bytes per token as gemma3-1b) at hidden
                256, MLP 768, vocab 4096; written with numpy (no torch or transformers: the
                hybrid group's CPU runs)
  eagle1        an EAGLE-1 draft head for --target LAYOUT (fc [H, 2H] + bias, layers.0.* without
                input_layernorm; embedding and lm_head shared from the target)
  eagle3        an EAGLE-3 draft head for --target LAYOUT (fc [H, 3H], midlayer.* with 2H
                attention inputs and hidden_norm, norm, lm_head over draft_vocab_size ids with
                d2t (I64) / t2d (BOOL): 32000 ids, or vocab/2 for the tiny layouts)

    python3 tools/make_checkpoint.py --layout eagle3 --target 8b --seed 0 --out /tmp/eagle3-8b

The model is built on the `meta` device in the target dtype, materialised empty on the CPU and
filled with seeded normals (std 0.02; norm weights 1 + N(0, 0.02^2); q/k/v biases std 0.1) chunk
by chunk on all cores: each chunk has its own generator seeded from (seed, tensor name, chunk),
so the bits depend only on the seed, never on the thread count. An 8B checkpoint takes about a
minute on 16 cores. The folder then holds config.json, model*.safetensors (save_pretrained) and
a tokenizer.json: byte-level BPE with the Llama-3 pre-tokenizer regex, trained here with the
`tokenizers` package on a seeded synthetic corpus (a few thousand merges), with the special
tokens <|begin_of_text|> / <|end_of_text|> at the config's bos / eos ids (< vocab_size), and a
post-processor that prepends BOS, as Llama 3's does.

Needs torch, transformers and tokenizers (works on a CPU-only machine). The DeepSeek layouts
need only numpy (and tokenizers for tokenizer.json, skipped with a note where it is missing):
write_numpy_layout writes DeepSeek's own config.json keys and HF tensor names
(model.layers.N.self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj, o_proj; mlp.{gate,up,down}_proj; with DSA self_attn.indexer.{wq_b,
wk, k_norm (weight, bias), weights_proj}, drawn after everything else) with seeded normals:
embedding N(0, 1), linears N(0, 1/in_features), norms 1 + N(0, 0.1^2) (the indexer's LayerNorm
bias N(0, 0.1^2)), so logits are O(1) and well apart. The Bamba layout is written the same
way (write_numpy_layout) in transformers' BambaConfig keys and BambaForCausalLM tensor names
(model.final_layernorm, layers.N.{input_layernorm, pre_ff_layernorm, feed_forward.*,
self_attn.* | mamba.{in_proj, conv1d (weight [conv_dim, 1, d_conv], bias), dt_bias, A_log, D,
norm, out_proj}}): conv N(0, 1/d_conv), conv bias N(0, 0.1^2), dt_bias N(-1, 0.5^2), A_log
log U(1, 16), D and the gated norm 1 + N(0, 0.1^2).
"""

import argparse
import concurrent.futures
import json
import os
import random
import sys
import time
import zlib

LAYOUTS = {
    "tiny": dict(arch="llama", vocab_size=4096, hidden_size=256, intermediate_size=768,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, max_position_embeddings=4096, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, bos=4000, eos=4001),
    "qwen2-tiny": dict(arch="qwen2", vocab_size=4096, hidden_size=256, intermediate_size=768,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, bos=4000, eos=4001),
    "mistral-tiny": dict(arch="mistral", vocab_size=4096, hidden_size=256,
                         intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         sliding_window=32, bos=4000, eos=4001),
    "1b": dict(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
               num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=True,
               rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=8192),
               bos=128000, eos=128001),
    "8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, max_position_embeddings=131072, rope_theta=500000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=False,
               rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=8192),
               bos=128000, eos=128001),
    "gemma2-tiny": dict(arch="gemma2", vocab_size=4096, hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, max_position_embeddings=4096, rope_theta=10000.0,
                        rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=32,
                        query_pre_attn_scalar=64, attn_logit_softcapping=50.0,
                        final_logit_softcapping=30.0, bos=4000, eos=4001),
    "gemma3-tiny": dict(arch="gemma3", vocab_size=4096, hidden_size=256, intermediate_size=768,
                        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, max_position_embeddings=4096, rope_theta=1e6,
                        rope_local_base_freq=10000.0, sliding_window_pattern=3,
                        rope_scaling=dict(rope_type="linear", factor=8.0),
                        rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=32,
                        query_pre_attn_scalar=64, bos=4000, eos=4001),
    "gemma3-1b": dict(arch="gemma3", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=256, max_position_embeddings=32768, rope_theta=1e6,
                      rope_local_base_freq=10000.0, sliding_window_pattern=6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=512,
                      query_pre_attn_scalar=256, bos=262000, eos=262001),
    "qwen2-0.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=896,
                       intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, bos=151643, eos=151645),
}

# DeepSeek layouts: written with numpy (write_numpy_layout), DeepSeek's config.json keys.
DEEPSEEK_LAYOUTS = {
    "deepseek-v2-tiny": dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", vocab_size=4096,
        hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, rope_theta=10000.0, rope_scaling=None,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        hidden_act="silu", attention_bias=False, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=3,
        moe_layer_freq=1, topk_method="greedy", n_group=1, topk_group=1,
        routed_scaling_factor=1.0, scoring_func="softmax", norm_topk_prob=False,
        bos_token_id=4000, eos_token_id=4001),
    "deepseek-v3-tiny": dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=4096,
        hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=24, rope_theta=10000.0,
        rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32,
                          beta_fast=32, beta_slow=1, mscale=0.8, mscale_all_dim=0.6),
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        hidden_act="silu", attention_bias=False, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=3,
        moe_layer_freq=1, num_nextn_predict_layers=0, topk_method="noaux_tc", n_group=1,
        topk_group=1, routed_scaling_factor=2.5, scoring_func="sigmoid", norm_topk_prob=True,
        bos_token_id=4000, eos_token_id=4001),
}
DEEPSEEK_LAYOUTS["deepseek-v2-lite"] = dict(
    DEEPSEEK_LAYOUTS["deepseek-v2-tiny"], vocab_size=102400, hidden_size=2048,
    intermediate_size=10944, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, rope_scaling=dict(type="yarn", factor=40.0,
                                      original_max_position_embeddings=4096, beta_fast=32,
                                      beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
    max_position_embeddings=163840, n_routed_experts=64, n_shared_experts=2,
    num_experts_per_tok=6, moe_intermediate_size=1408, first_k_dense_replace=27,
    bos_token_id=100000, eos_token_id=100001)
DEEPSEEK_LAYOUTS["deepseek-v2-lite-narrow"] = dict(
    DEEPSEEK_LAYOUTS["deepseek-v2-lite"], vocab_size=4096, intermediate_size=1024,
    num_hidden_layers=4, first_k_dense_replace=4, bos_token_id=4000, eos_token_id=4001)
DEEPSEEK_LAYOUTS["deepseek-v32-tiny"] = dict(
    DEEPSEEK_LAYOUTS["deepseek-v3-tiny"], architectures=["DeepseekV32ForCausalLM"],
    model_type="deepseek_v32", index_n_heads=4, index_head_dim=32, index_topk=16)


# Bamba (Mamba2 + attention hybrid): written with numpy (write_numpy_layout), transformers'
# BambaConfig keys as save_pretrained writes them (mamba_d_head resolved, partial_rotary_factor
# 0.5, which BambaConfig fixes).
BAMBA_LAYOUTS = {
    "bamba-tiny": dict(
        architectures=["BambaForCausalLM"], model_type="bamba", vocab_size=4096, hidden_size=128,
        intermediate_size=256, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
        attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=2,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8,
        mamba_conv_bias=True, mamba_proj_bias=False, time_step_min=0.001, time_step_max=0.1,
        z_loss_coefficient=0.0, num_logits_to_keep=1, partial_rotary_factor=0.5,
        rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0,
        initializer_range=0.02, use_cache=True, pad_token_id=0, bos_token_id=4000,
        eos_token_id=4001, time_step_limit=[0.0, float("inf")]),  # json writes it as Infinity
}
BAMBA_LAYOUTS["bamba-1b"] = dict(
    BAMBA_LAYOUTS["bamba-tiny"], vocab_size=32000, hidden_size=2048, intermediate_size=7168,
    num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, attn_layer_indices=[5, 11],
    mamba_n_heads=64, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_chunk_size=256,
    max_position_embeddings=131072, bos_token_id=31998, eos_token_id=31999)
BAMBA_LAYOUTS["bamba-small"] = dict(
    BAMBA_LAYOUTS["bamba-tiny"], hidden_size=256, intermediate_size=512, num_hidden_layers=6,
    attn_layer_indices=[2], mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1,
    mamba_d_state=128, mamba_chunk_size=256, max_position_embeddings=131072)

# Gemma 3 text layouts written with numpy (write_numpy_layout: no torch or transformers), in
# Gemma3TextConfig's config.json keys and Gemma3ForCausalLM's tensor names; draws as
# gemma_weights says.
GEMMA_NUMPY_LAYOUTS = {
    "gemma3-1b-narrow": dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=4096,
        hidden_size=256, intermediate_size=768, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        sliding_window_pattern=6, rope_theta=1e6, rope_local_base_freq=10000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh", attention_bias=False, attention_dropout=0.0,
        final_logit_softcapping=None, attn_logit_softcapping=None, pad_token_id=0,
        bos_token_id=4000, eos_token_id=4001),
}


def normal_init(rng):
    """The numpy layouts' draws: lin(out, in) N(0, 1/in) [out, in]; norm(n) 1 + N(0, 0.1^2)."""
    def lin(out_f, in_f):
        return rng.normal(0, in_f ** -0.5, (out_f, in_f))

    def norm(n):
        return 1.0 + rng.normal(0, 0.1, n)

    return lin, norm


def bamba_weights(cfg, rng):
    """HF-named float32 arrays of a Bamba layout (scales in the module docstring)."""
    import numpy as np

    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // hq
    nh, di = cfg["mamba_n_heads"], cfg["mamba_expand"] * h
    cd = di + 2 * cfg["mamba_n_groups"] * cfg["mamba_d_state"]
    k = cfg["mamba_d_conv"]
    lin, norm = normal_init(rng)

    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (cfg["vocab_size"], h)),
         "model.final_layernorm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(cfg["vocab_size"], h)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        if l in cfg["attn_layer_indices"]:
            a = p + "self_attn."
            w[a + "q_proj.weight"] = lin(hq * d, h)
            w[a + "k_proj.weight"] = lin(hkv * d, h)
            w[a + "v_proj.weight"] = lin(hkv * d, h)
            w[a + "o_proj.weight"] = lin(h, hq * d)
        else:
            m = p + "mamba."
            w[m + "in_proj.weight"] = lin(di + cd + nh, h)
            w[m + "conv1d.weight"] = rng.normal(0, k ** -0.5, (cd, 1, k))
            if cfg["mamba_conv_bias"]:
                w[m + "conv1d.bias"] = rng.normal(0, 0.1, cd)
            w[m + "dt_bias"] = rng.normal(-1.0, 0.5, nh)
            w[m + "A_log"] = np.log(rng.uniform(1.0, 16.0, nh))
            w[m + "D"] = norm(nh)
            w[m + "norm.weight"] = norm(di)
            w[m + "out_proj.weight"] = lin(h, di)
            if cfg["mamba_proj_bias"]:
                w[m + "in_proj.bias"] = rng.normal(0, 0.1, di + cd + nh)
                w[m + "out_proj.bias"] = rng.normal(0, 0.1, h)
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "pre_ff_layernorm.weight"] = norm(h)
        w[p + "feed_forward.gate_proj.weight"] = lin(inter, h)
        w[p + "feed_forward.up_proj.weight"] = lin(inter, h)
        w[p + "feed_forward.down_proj.weight"] = lin(h, inter)
    return {k: v.astype(np.float32) for k, v in w.items()}


def gemma_weights(cfg, rng):
    """HF-named float32 arrays of a Gemma 3 text layout: embedding N(0, 0.1^2), linears
    N(0, 1/in), norms N(0, 0.1^2) (Gemma's norms scale by 1 + w)."""
    import numpy as np

    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    lin, _ = normal_init(rng)

    def norm(n):
        return rng.normal(0, 0.1, n)

    w = {"model.embed_tokens.weight": rng.normal(0, 0.1, (cfg["vocab_size"], h)),
         "model.norm.weight": norm(h)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        w[a + "q_proj.weight"] = lin(hq * d, h)
        w[a + "k_proj.weight"] = lin(hkv * d, h)
        w[a + "v_proj.weight"] = lin(hkv * d, h)
        w[a + "o_proj.weight"] = lin(h, hq * d)
        w[a + "q_norm.weight"] = norm(d)
        w[a + "k_norm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = norm(h)
    return {k: v.astype(np.float32) for k, v in w.items()}


def deepseek_weights(cfg, rng):
    """HF-named float32 arrays of a dense DeepSeek layout (scales in the module docstring)."""
    import numpy as np

    h, inter, hq = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    qr, r = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    lin, norm = normal_init(rng)

    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (cfg["vocab_size"], h)),
         "model.norm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(cfg["vocab_size"], h)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        if qr:
            w[a + "q_a_proj.weight"] = lin(qr, h)
            w[a + "q_a_layernorm.weight"] = norm(qr)
            w[a + "q_b_proj.weight"] = lin(hq * qk, qr)
        else:
            w[a + "q_proj.weight"] = lin(hq * qk, h)
        w[a + "kv_a_proj_with_mqa.weight"] = lin(r + cfg["qk_rope_head_dim"], h)
        w[a + "kv_a_layernorm.weight"] = norm(r)
        w[a + "kv_b_proj.weight"] = lin(hq * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), r)
        w[a + "o_proj.weight"] = lin(h, hq * cfg["v_head_dim"])
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
    for l in range(cfg["num_hidden_layers"] if cfg.get("index_topk") else 0):
        x = f"model.layers.{l}.self_attn.indexer."
        ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
        w[x + "wq_b.weight"] = lin(ih * idim, qr)
        w[x + "wk.weight"] = lin(idim, h)
        w[x + "k_norm.weight"] = norm(idim)
        w[x + "k_norm.bias"] = rng.normal(0, 0.1, idim)
        w[x + "weights_proj.weight"] = lin(ih, h)
    return {k: v.astype(np.float32) for k, v in w.items()}


def save_safetensors(path, tensors, dtype_name):
    """float32 arrays → one safetensors file in F32 or BF16 (round to nearest even)."""
    import numpy as np

    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype_name == "bf16":
            u = a.view(np.uint32).astype(np.uint64)
            data = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        else:
            data = a.tobytes()
        header[name] = {"dtype": "BF16" if dtype_name == "bf16" else "F32",
                        "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for b in blobs:
            f.write(b)


def write_numpy_layout(layout, dtype_name, seed, out, tokenizer=True):
    """Writes a DeepSeek, Bamba or numpy Gemma layout (config.json, model.safetensors,
    tokenizer.json when the tokenizers package imports); returns (config dict, float32 weights
    as written)."""
    import numpy as np

    for layouts, weights in ((BAMBA_LAYOUTS, bamba_weights), (DEEPSEEK_LAYOUTS, deepseek_weights),
                             (GEMMA_NUMPY_LAYOUTS, gemma_weights)):
        if layout in layouts:
            cfg = dict(layouts[layout])
            break
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f32": "float32"}[dtype_name]
    w = weights(cfg, np.random.default_rng(seed))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(out, "model.safetensors"), w, dtype_name)
    if tokenizer:
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            print("tokenizers is not installed: no tokenizer.json (use --token-ids)")
        else:
            write_tokenizer(out, argparse.Namespace(**cfg), seed,
                            gemma=cfg["model_type"].startswith("gemma"))
    return cfg, w



# Llama 3's pre-tokenizer split pattern (tokenizer.json of Meta-Llama-3).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
TOKENIZER_SIZE = 3840  # 256 bytes + 3584 merges


def make_config(layout):
    import transformers

    spec = dict(LAYOUTS[layout])
    arch = spec.pop("arch")
    bos, eos = spec.pop("bos"), spec.pop("eos")
    assert bos < spec["vocab_size"] and eos < spec["vocab_size"]
    rope_scaling = spec.pop("rope_scaling", None)
    gemma = arch.startswith("gemma")
    kwargs = dict(spec, bos_token_id=bos, eos_token_id=eos)
    if gemma:
        kwargs.update(hidden_activation="gelu_pytorch_tanh", attention_bias=False)
    else:
        kwargs.update(hidden_act="silu")
    if arch == "gemma2":
        cls = transformers.Gemma2Config
    elif arch == "gemma3":
        cls = transformers.Gemma3TextConfig
    elif arch == "llama":
        cls = transformers.LlamaConfig
        kwargs.update(attention_bias=False, mlp_bias=False)
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
        kwargs.update(use_sliding_window=False, max_window_layers=spec["num_hidden_layers"])
    else:
        cls = transformers.MistralConfig
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    # save_pretrained records the weights' dtype (torch_dtype in transformers 4, dtype in 5).
    return cls(**kwargs), arch


def model_class(arch):
    import transformers

    return {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "mistral": transformers.MistralForCausalLM,
            "gemma2": transformers.Gemma2ForCausalLM,
            "gemma3": transformers.Gemma3ForCausalLM}[arch]


def fill_weights(model, seed, threads, norm_mean=1.0):
    """Seeded normal init, chunk-parallel; deterministic for any thread count. norm_mean 0 for
    Gemma, whose norms scale by 1 + w."""
    import torch

    chunk = 1 << 24
    jobs = []
    for name, p in model.named_parameters():  # tied parameters appear once
        flat = p.data.view(-1)
        if name.endswith("norm.weight"):
            mean, std = norm_mean, 0.02
        elif name.endswith(".bias"):
            mean, std = 0.0, 0.1
        else:
            mean, std = 0.0, 0.02
        base = zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)
        for i, start in enumerate(range(0, flat.numel(), chunk)):
            jobs.append((flat[start:start + chunk], mean, std, (base * 1000003 + i) % (1 << 63)))

    def run(job):
        view, mean, std, s = job
        g = torch.Generator().manual_seed(s)
        view.normal_(mean, std, generator=g)

    torch.set_num_threads(1)  # parallelism comes from the chunks
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
        list(ex.map(run, jobs))


def synthetic_corpus(seed, n_lines=20000):
    """Deterministic text with words, numbers, punctuation, whitespace runs and some Unicode."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ren", "ta", "the", "and", "ing", "er", "on", "st", "qu", "ion",
            "pre", "com", "ver", "al", "is", "to", "un", "de", "ex", "tion", "ment", "ly"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words += ["the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was",
              "model", "token", "cache", "page", "attention", "kernel", "GPU", "CPU", "Hello",
              "naïve", "café", "Straße", "数据", "模型", "東京", "🙂", "🚀", "Ωmega", "привет"]
    punct = [".", ",", "!", "?", ";", ":", "'s", "'t", "(", ")", "\"", "-", "—", "..."]
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 18)):
            r = rng.random()
            if r < 0.75:
                w = rng.choice(words)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.85:
                parts.append(str(rng.randint(0, 100000)))
            else:
                parts.append(rng.choice(punct))
        sep = "  " if rng.random() < 0.05 else " "
        lines.append(sep.join(parts) + ("\n\n" if rng.random() < 0.1 else "\n"))
    return lines


# Gemma's chat turns (its tokenizer's <start_of_turn> / <end_of_turn>; "assistant" is "model").
GEMMA_TURNS = ("<start_of_turn>", "<end_of_turn>")
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def write_tokenizer(out, config, seed, gemma=False):
    """gemma: also the turn tokens (the two ids after the larger of BOS / EOS) and Gemma's chat
    template in tokenizer_config.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    size = min(TOKENIZER_SIZE, config.bos_token_id, config.eos_token_id)
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS_TOKEN}:0 $A:0", pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
            special_tokens=[(BOS_TOKEN, config.bos_token_id)]),
    ])
    # Special tokens at the config's ids. `tokenizers` renumbers added tokens unless they
    # continue the model vocabulary without a gap, so the BPE vocabulary is padded up to the
    # first special id with unreachable entries (no merge produces them), and ids between BOS and
    # EOS become reserved special tokens, as in Llama 3's tokenizer.json.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    first, last = sorted([config.bos_token_id, config.eos_token_id])
    for i in range(len(vocab), first):
        vocab[f"<|unused_bpe_{i}|>"] = i
    names = {config.bos_token_id: BOS_TOKEN, config.eos_token_id: EOS_TOKEN}
    if gemma:
        assert last + 2 < config.vocab_size
        names.update({last + 1: GEMMA_TURNS[0], last + 2: GEMMA_TURNS[1]})
        last += 2
    data["added_tokens"] = [
        {"id": tid, "content": names.get(tid, f"<|reserved_special_token_{tid - first}|>"),
         "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for tid in range(first, last + 1)
    ]
    path = os.path.join(out, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)
    check = Tokenizer.from_file(path)
    ids = check.encode("Hello world").ids
    assert ids[0] == config.bos_token_id and max(ids) < config.vocab_size, ids
    assert check.token_to_id(EOS_TOKEN) == config.eos_token_id
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN,
                  "eos_token": EOS_TOKEN, "add_bos_token": True,
                  "model_max_length": config.max_position_embeddings}
    if gemma:
        assert check.token_to_id(GEMMA_TURNS[1]) == last
        tok_config["chat_template"] = GEMMA_CHAT_TEMPLATE
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=2)
    return check.get_vocab_size()


def write_eagle_head(layout, target, dtype_name, seed, out):
    """A random EAGLE-1 / EAGLE-3 head of the target layout's shapes (config.json +
    model.safetensors), named as yuhuili's EAGLE-1 and EAGLE-3 checkpoints name them."""
    import torch
    from safetensors.torch import save_file

    t = LAYOUTS[target]
    assert t["arch"] == "llama", "EAGLE heads are written for Llama target layouts"
    h, inter, v = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    hq, hkv = t["num_attention_heads"], t["num_key_value_heads"]
    d = t.get("head_dim", h // hq)
    e3 = layout == "eagle3"
    vd = (32000 if v > 64000 else v // 2) if e3 else v
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, mean=0.0, std=0.02):
        return (torch.randn(*shape, generator=g) * std + mean).to(dtype)

    p = "midlayer." if e3 else "layers.0."
    a_in = 2 * h if e3 else h
    w = {"fc.weight": normal(h, 3 * h if e3 else 2 * h)}
    if not e3:
        w["fc.bias"] = normal(h, std=0.1)
    else:
        w[p + "input_layernorm.weight"] = normal(h, mean=1.0)
        w[p + "hidden_norm.weight"] = normal(h, mean=1.0)
        w["norm.weight"] = normal(h, mean=1.0)
        w["lm_head.weight"] = normal(vd, h)
        ids = torch.sort(torch.randperm(v, generator=g)[:vd]).values
        w["d2t"] = (ids - torch.arange(vd)).to(torch.int64)
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[ids] = True
        w["t2d"] = t2d
    w[p + "self_attn.q_proj.weight"] = normal(hq * d, a_in)
    w[p + "self_attn.k_proj.weight"] = normal(hkv * d, a_in)
    w[p + "self_attn.v_proj.weight"] = normal(hkv * d, a_in)
    w[p + "self_attn.o_proj.weight"] = normal(h, hq * d)
    w[p + "post_attention_layernorm.weight"] = normal(h, mean=1.0)
    w[p + "mlp.gate_proj.weight"] = normal(inter, h)
    w[p + "mlp.up_proj.weight"] = normal(inter, h)
    w[p + "mlp.down_proj.weight"] = normal(h, inter)
    config = {
        "architectures": ["LlamaForCausalLMEagle3" if e3 else "LlamaForCausalLMEagle"],
        "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": 1, "num_attention_heads": hq, "num_key_value_heads": hkv,
        "head_dim": d, "rms_norm_eps": t["rms_norm_eps"], "rope_theta": t["rope_theta"],
        "max_position_embeddings": t["max_position_embeddings"], "vocab_size": v,
        "hidden_act": "silu", "torch_dtype": {"bf16": "bfloat16", "f32": "float32"}[dtype_name],
        "bos_token_id": t["bos"], "eos_token_id": t["eos"], "tie_word_embeddings": False,
    }
    if "rope_scaling" in t:
        config["rope_scaling"] = t["rope_scaling"]
    if e3:
        config["draft_vocab_size"] = vd
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: x.contiguous() for k, x in w.items()}, os.path.join(out, "model.safetensors"))
    n = sum(x.numel() for k, x in w.items() if k not in ("d2t", "t2d"))
    print(f"{layout} head for {target}: {n / 1e6:.1f} M parameters ({dtype_name}), in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", required=True,
                    choices=sorted(LAYOUTS) + sorted(DEEPSEEK_LAYOUTS) + sorted(BAMBA_LAYOUTS) +
                    sorted(GEMMA_NUMPY_LAYOUTS) + ["eagle1", "eagle3"])
    ap.add_argument("--target", default="tiny", choices=sorted(LAYOUTS),
                    help="--layout eagle1|eagle3: the target layout the head drafts for")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.layout in ("eagle1", "eagle3"):
        write_eagle_head(args.layout, args.target, args.dtype, args.seed, args.out)
        return 0
    if any(args.layout in x for x in (DEEPSEEK_LAYOUTS, BAMBA_LAYOUTS, GEMMA_NUMPY_LAYOUTS)):
        cfg, w = write_numpy_layout(args.layout, args.dtype, args.seed, args.out)
        n = sum(x.size for x in w.values())
        print(f"{args.layout}: {n / 1e6:.2f} M parameters ({args.dtype}), in {args.out}")
        return 0

    import torch

    t0 = time.time()
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    config, arch = make_config(args.layout)
    with torch.device("meta"):
        model = model_class(arch)(config)
    model = model.to(dtype).to_empty(device="cpu")
    if config.tie_word_embeddings:
        model.tie_weights()
    fill_weights(model, args.seed, max(1, args.threads),
                 norm_mean=0.0 if arch.startswith("gemma") else 1.0)
    t_fill = time.time()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    t_save = time.time()
    n_tok = write_tokenizer(args.out, config, args.seed, gemma=arch.startswith("gemma"))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.layout}: {n_params / 1e9:.3f} B parameters ({args.dtype}), tokenizer {n_tok} "
          f"tokens, in {args.out}: init {t_fill - t0:.1f} s, save {t_save - t_fill:.1f} s, "
          f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
