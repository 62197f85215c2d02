#!/usr/bin/env python3
"""Image encoding beside llama.cpp's `llama-mtmd-cli`: one 896×896 image through a
SmolVLM-sized encoder, the same files and threads.

    python3 benches/vision_encode.py [-t 2] [-r 3] [--out DIR]

Writes, once, into DIR (default $FRINK_HOME/bench, never committed):
- `smolvlm-256m-mmproj-f16.gguf`: a projector file with the shapes of
  SmolVLM-256M-Instruct's (`idefics3`: SigLIP of width 768, 12 layers, 12 heads, FFN 3072,
  512×512 pixels in 16×16 patches, pixel shuffle 4 into 64 rows per tile, projection to
  576; the processor's longest edge 2048), random weights, matrices F16 as the published
  `mmproj-*-f16.gguf` files store them (embeddings F32, as the converter forces);
- `smolvlm-256m-lm-1layer.gguf`: a one-layer Llama of SmolLM2-135M's width (576) with
  SmolLM2's tokenizer (borrowed from the catalog's smollm2-135m) plus SmolVLM's image
  tokens, so both programs can lay the image out;
- `gradient-896.png`: the test image.

An 896×896 image becomes 4 × 4 tiles plus a global view: 17 encoder passes of 1,024
patches. Reported per program: the median over `-r` runs of the image's time: frink's
`image_ms` (`frink run --json`: reading, decoding, resizing and encoding), llama.cpp's sum
of its per-piece encoding lines ("mtmd batch encoding done in": encoding only, its
preprocessing not counted), and the ratio llama.cpp ÷ frink (above 1: frink is faster).
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_min as g  # noqa: E402
from real_shapes import FRINK, default_tool, fill_q8_0, ones, pull, tokenizer_kv, zeros  # noqa: E402
from tools import FRINK_HOW, LLAMA_HOW, require_program  # noqa: E402

# SmolVLM-256M-Instruct's vision config and processor (its config.json and
# preprocessor_config.json).
V = dict(n_embd=768, n_ff=3072, n_layer=12, n_head=12, image_size=512, patch=16, scale=4,
         n_out=576, longest=2048)
SPECIAL = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
           + [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)])


# Each high byte of an F16 value: sign kept, exponent fixed at 2⁻⁶, mantissa's top bits kept.
_HIGH = bytes((b & 0x83) | 0x24 for b in range(256))


def fill_f16(f, n):
    """Random F16 values of magnitude 2⁻⁶ to 2⁻⁵ and random sign (finite, small)."""
    left = n // 2
    while left:
        k = min(1 << 20, left)
        out = bytearray(os.urandom(2 * k))
        out[1::2] = bytes(out[1::2]).translate(_HIGH)
        f.write(out)
        left -= k


def fill_f32_small(f, n):
    f.write(struct.pack("<f", 0.01) * (n // 4))


def mmproj(path):
    d, ff, p = V["n_embd"], V["n_ff"], V["patch"]
    n_patch = (V["image_size"] // p) ** 2
    kv = [("general.architecture", g.STRING, "clip"), ("general.type", g.STRING, "mmproj"),
          ("general.name", g.STRING, "SmolVLM-256M-Instruct shapes (random weights)"),
          ("clip.has_vision_encoder", g.BOOL, True), ("clip.projector_type", g.STRING, "idefics3"),
          ("clip.use_gelu", g.BOOL, True),
          ("clip.vision.image_size", g.U32, V["image_size"]), ("clip.vision.patch_size", g.U32, p),
          ("clip.vision.embedding_length", g.U32, d), ("clip.vision.feed_forward_length", g.U32, ff),
          ("clip.vision.block_count", g.U32, V["n_layer"]),
          ("clip.vision.attention.head_count", g.U32, V["n_head"]),
          ("clip.vision.attention.layer_norm_epsilon", g.F32, 1e-6),
          ("clip.vision.projection_dim", g.U32, V["n_out"]),
          ("clip.vision.image_mean", g.ARRAY, (g.F32, [0.5, 0.5, 0.5])),
          ("clip.vision.image_std", g.ARRAY, (g.F32, [0.5, 0.5, 0.5])),
          ("clip.vision.projector.scale_factor", g.U32, V["scale"]),
          ("clip.vision.preproc_image_size", g.U32, V["longest"])]
    F, H = g.GGML_F32, g.GGML_F16
    t = [("v.patch_embd.weight", [p, p, 3, d], F, fill_f32_small),
         ("v.patch_embd.bias", [d], F, zeros),
         ("v.position_embd.weight", [d, n_patch], F, fill_f32_small)]
    for il in range(V["n_layer"]):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t += [(b + n + ".weight", [d, d], H, fill_f16), (b + n + ".bias", [d], F, zeros)]
        t += [(b + "ln1.weight", [d], F, ones(d)), (b + "ln1.bias", [d], F, zeros),
              (b + "ln2.weight", [d], F, ones(d)), (b + "ln2.bias", [d], F, zeros),
              (b + "ffn_up.weight", [d, ff], H, fill_f16), (b + "ffn_up.bias", [ff], F, zeros),
              (b + "ffn_down.weight", [ff, d], H, fill_f16), (b + "ffn_down.bias", [d], F, zeros)]
    t += [("v.post_ln.weight", [d], F, ones(d)), ("v.post_ln.bias", [d], F, zeros),
          ("mm.model.fc.weight", [d * V["scale"] ** 2, V["n_out"]], H, fill_f16)]
    g.write(path + ".tmp", kv, t)
    os.replace(path + ".tmp", path)


def language_model(path):
    template = g.Reader(pull("smollm2-135m"))
    have = len(template.kv["tokenizer.ggml.tokens"][1][1])
    n_vocab = have + len(SPECIAL)
    tok = tokenizer_kv(template, n_vocab)
    for i, (key, ty, v) in enumerate(tok):
        if key == "tokenizer.ggml.tokens":
            tok[i] = (key, ty, (v[0], v[1][:have] + SPECIAL))
        elif key == "tokenizer.ggml.token_type":
            tok[i] = (key, ty, (v[0], v[1][:have] + [3] * len(SPECIAL)))
    a, d, ff = "llama", V["n_out"], 1536
    kv = [("general.architecture", g.STRING, a), ("general.type", g.STRING, "model"),
          ("general.name", g.STRING, "SmolLM2 width, one layer (random weights)"),
          (f"{a}.block_count", g.U32, 1), (f"{a}.context_length", g.U32, 8192),
          (f"{a}.embedding_length", g.U32, d), (f"{a}.feed_forward_length", g.U32, ff),
          (f"{a}.attention.head_count", g.U32, 9), (f"{a}.attention.head_count_kv", g.U32, 3),
          (f"{a}.rope.freq_base", g.F32, 100000.0),
          (f"{a}.attention.layer_norm_rms_epsilon", g.F32, 1e-5),
          ("general.file_type", g.U32, 7), ("general.quantization_version", g.U32, 2)] + tok
    Q, F = g.GGML_Q8_0, g.GGML_F32
    b = "blk.0."
    t = [("token_embd.weight", [d, n_vocab], Q, fill_q8_0),
         (b + "attn_norm.weight", [d], F, ones(d)),
         (b + "attn_q.weight", [d, d], Q, fill_q8_0), (b + "attn_k.weight", [d, 192], Q, fill_q8_0),
         (b + "attn_v.weight", [d, 192], Q, fill_q8_0), (b + "attn_output.weight", [d, d], Q, fill_q8_0),
         (b + "ffn_norm.weight", [d], F, ones(d)),
         (b + "ffn_gate.weight", [d, ff], Q, fill_q8_0), (b + "ffn_up.weight", [d, ff], Q, fill_q8_0),
         (b + "ffn_down.weight", [ff, d], Q, fill_q8_0),
         ("output_norm.weight", [d], F, ones(d))]
    g.write(path + ".tmp", kv, t)
    os.replace(path + ".tmp", path)


def png(path, w, h):
    """An RGB gradient with texture, as a PNG (no image library needed)."""
    rows = bytearray()
    for y in range(h):
        rows.append(0)
        for x in range(w):
            rows += bytes(((x * 255) // w, (y * 255) // h, (x * y + 7 * x) % 256))
    chunk = lambda k, data: (struct.pack(">I", len(data)) + k + data  # noqa: E731
                             + struct.pack(">I", zlib.crc32(k + data) & 0xFFFFFFFF))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b""))


def frink_ms(lm, mm, image, threads):
    r = subprocess.run([FRINK, "run", "-m", lm, "--mmproj", mm, "--image", image, "-n", "1",
                        "-t", str(threads), "--greedy", "--json", "Describe it."],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"frink failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["timings"]["image_ms"]


def llama_ms(tool, lm, mm, image, threads):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(tool) + ":" + env.get("LD_LIBRARY_PATH", "")
    r = subprocess.run([tool, "-m", lm, "--mmproj", mm, "--image", image, "-n", "1", "-t", str(threads),
                        "--temp", "0", "-p", "Describe it."], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"llama-mtmd-cli failed:\n{r.stderr[-2000:]}")
    # Its encoder times per image piece (this build: "mtmd batch encoding done in N ms";
    # others: "image slice encoded in N ms").
    slices = [int(m) for m in re.findall(r"(?:batch encoding done|slice encoded) in (\d+) ms",
                                         r.stderr)]
    return sum(slices), len(slices)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    home = os.environ.get("FRINK_HOME", os.path.expanduser("~/.cache/frink"))
    ap.add_argument("--out", default=os.path.join(home, "bench"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeat", type=int, default=3)
    a = ap.parse_args()
    require_program(FRINK, "frink", FRINK_HOW)
    tool = require_program(os.environ.get("LLAMA_MTMD_CLI", default_tool("llama-mtmd-cli")),
                           "llama-mtmd-cli", LLAMA_HOW)
    os.makedirs(a.out, exist_ok=True)
    mm = os.path.join(a.out, "smolvlm-256m-mmproj-f16.gguf")
    lm = os.path.join(a.out, "smolvlm-256m-lm-1layer.gguf")
    image = os.path.join(a.out, "gradient-896.png")
    for path, make in ((mm, mmproj), (lm, language_model), (image, lambda p: png(p, 896, 896))):
        if not os.path.exists(path):
            print(f"writing {path}", file=sys.stderr)
            make(path)
    fr, ll, n_slices = [], [], 0
    for _ in range(a.repeat):  # alternated, so a slow moment of the machine hits both
        fr.append(frink_ms(lm, mm, image, a.threads))
        ms, n_slices = llama_ms(tool, lm, mm, image, a.threads)
        ll.append(ms)
    f, l_ = statistics.median(fr), statistics.median(ll)
    print(f"896×896 image, SmolVLM-256M encoder shapes (F16), {n_slices} encoder passes, "
          f"{a.threads} threads, median of {a.repeat}")
    print(f"  frink image_ms (decode + resize + encode): {f:.0f} ms  (runs: {', '.join(f'{x:.0f}' for x in fr)})")
    print(f"  llama-mtmd-cli slices encoded:             {l_:.0f} ms  (runs: {', '.join(str(x) for x in ll)})")
    print(f"  llama.cpp / frink: {l_ / f:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
