#!/usr/bin/env python3
"""Random-weight GGUF files with real models' shapes and llama-quantize's type mixes, written
with the Python standard library alone: for the GPU machine, which has no llama-quantize, no
catalog model to borrow a tokenizer from, and no network.

    python3 benches/gpu_shapes.py OUT_DIR [MODEL:TYPE ...] [--layers N]

MODEL:TYPE defaults to every pair below: llama3.1-8b:Q4_0, :Q4_K_M, :Q8_0, :F16;
qwen2.5-1.5b:Q4_K_M; gemma3-1b:Q4_K_M (the hyperparameters are benches/real_shapes.py's).
`--layers N` keeps the first N layers (a quick file for tests). Every matrix is written
directly in its final type as random blocks with small finite scales (timings do not depend
on the values); the types follow llama.cpp's `llama_tensor_get_type` for the file type:
Q4_K_M: Q4_K, but Q6_K for attn_v and ffn_down on the layers `use_more_bits` picks (the first
and last eighth, every third between) and for the LM head (the token table when tied);
Q4_0: Q4_0 with a Q6_K LM head; Q8_0 and F16: that type throughout; norms F32; a K-quant
on rows that are not whole 256-value blocks (Gemma-3-1B's 1152) falls back to Q5_0 (Q4_K)
or Q8_0 (Q6_K), as llama-quantize does. The
tokenizer is a made-up SentencePiece vocabulary (the byte tokens and a few words) padded to
the real vocabulary size. A file already present is kept.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_min as g  # noqa: E402
import real_shapes as rs  # noqa: E402

Q4_0, Q5_0, Q8_0 = (2, 32, 18), (6, 32, 22), (8, 32, 34)
Q4_K, Q6_K = (12, 256, 144), (14, 256, 210)
F16, F32 = g.GGML_F16, g.GGML_F32
# Byte offsets of the f16 scales in a block of each type (ggml's block layouts).
F16_FIELDS = {2: [0], 6: [0], 8: [0], 12: [0, 2], 14: [208]}
# A K-quant on rows that are not whole 256-value blocks falls back (llama-quantize's
# fallback for a row length that is not a multiple of QK_K).
FALLBACK = {12: Q5_0, 14: Q8_0}
# llama.cpp's llama_ftype numbers for general.file_type.
FTYPE = {"Q4_0": 2, "Q8_0": 7, "F16": 1, "Q4_K_M": 15}
PAIRS = ["llama3.1-8b:Q4_0", "llama3.1-8b:Q4_K_M", "llama3.1-8b:Q8_0", "llama3.1-8b:F16",
         "qwen2.5-1.5b:Q4_K_M", "gemma3-1b:Q4_K_M"]


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def target_type(ftype, name, m, row):
    """The type llama-quantize gives tensor `name` (a matrix of rows of `row` values) in a
    `ftype` file."""
    t = base_type(ftype, name, m)
    if t[1] == 256 and row % 256:
        return FALLBACK[t[0]]
    return t


def base_type(ftype, name, m):
    """`target_type` before the fallback for rows of partial K-quant blocks."""
    lm_head = name == "output.weight" or (name == "token_embd.weight" and m["tied"])
    if ftype in ("Q8_0", "F16"):
        return {"Q8_0": Q8_0, "F16": F16}[ftype]
    if lm_head:
        return Q6_K
    if ftype == "Q4_0":
        return Q4_0
    if name.startswith("blk.") and name.split(".")[2] in ("attn_v", "ffn_down"):
        if use_more_bits(int(name.split(".")[1]), m["n_layer"]):
            return Q6_K
    return Q4_K


# The high byte of an f16 with its exponent bits cut to make a small finite value.
F16_HIGH = bytes(b & 0x33 for b in range(256))


def fill_random(ggml_type, scale=2.7e-4):
    """Random blocks of `ggml_type` with every f16 scale `scale` (F16: random small values)."""
    tid, _, bs = ggml_type

    def fill(f, n):
        chunk = (8 << 20) // bs * bs
        h = struct.pack("<e", scale)
        left = n
        while left:
            k = min(chunk, left)
            out = bytearray(os.urandom(k))
            if tid == 1:
                out[1::2] = out[1::2].translate(F16_HIGH)
            for o in F16_FIELDS.get(tid, []):
                out[o::bs] = h[0:1] * (k // bs)
                out[o + 1::bs] = h[1:2] * (k // bs)
            f.write(out)
            left -= k
    return fill


class SyntheticVocab:
    """A template object with the `kv` real_shapes.tokenizer_kv reads: a SentencePiece
    (`llama`) vocabulary of <unk>, <s>, </s>, the 256 byte tokens and a few words."""

    def __init__(self):
        words = ["\u2581" + w for w in ("the", "a", "of", "and", "to", "in", "is", "it")]
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
        types = [2, 3, 3] + [6] * 256 + [1] * len(words)
        self.kv = {
            "tokenizer.ggml.model": (g.STRING, "llama"),
            "tokenizer.ggml.tokens": (g.ARRAY, (g.STRING, toks)),
            "tokenizer.ggml.scores": (g.ARRAY, (g.F32, [0.0] * len(toks))),
            "tokenizer.ggml.token_type": (g.ARRAY, (g.I32, types)),
            "tokenizer.ggml.bos_token_id": (g.U32, 1),
            "tokenizer.ggml.eos_token_id": (g.U32, 2),
            "tokenizer.ggml.unknown_token_id": (g.U32, 0),
            "tokenizer.ggml.add_bos_token": (g.BOOL, True),
        }


def write(out_dir, model, ftype, layers):
    m = dict(rs.MODELS[model])
    if layers:
        m["n_layer"] = min(layers, m["n_layer"])
    suffix = f"-{m['n_layer']}l" if layers else ""
    path = os.path.join(out_dir, f"{model}-{ftype}{suffix}.gguf")
    if os.path.exists(path):
        print(f"{path}: present", file=sys.stderr)
        return path
    kv = [x if x[0] != "general.file_type" else (x[0], g.U32, FTYPE[ftype])
          for x in rs.model_kv(m, SyntheticVocab())]
    tensors = []
    for name, dims, gt, fill in rs.model_tensors(m):
        if gt == g.GGML_Q8_0:
            gt = target_type(ftype, name, m, dims[0])
            fill = fill_random(gt)
        tensors.append((name, dims, gt, fill))
    print(f"writing {path}", file=sys.stderr)
    g.write(path + ".tmp", kv, tensors)
    os.replace(path + ".tmp", path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("pairs", nargs="*", default=PAIRS)
    ap.add_argument("--layers", type=int, default=0)
    a = ap.parse_intermixed_args()
    os.makedirs(a.out, exist_ok=True)
    for p in a.pairs:
        model, _, ftype = p.partition(":")
        if model not in rs.MODELS or ftype not in FTYPE:
            sys.exit(f"{p}: expected MODEL:TYPE with MODEL in {', '.join(rs.MODELS)} "
                     f"and TYPE in {', '.join(FTYPE)}")
        print(write(a.out, model, ftype, a.layers))


if __name__ == "__main__":
    main()
