#!/usr/bin/env python3
"""LoRA beside llama.cpp, and its cost in decoding, on a catalog model.

    python3 benches/lora_compare.py [-m MODEL] [--rank 16] [--targets attn_q,attn_v,...]
                                    [--type f16|f32] [--ctx 128] [--speed]

Writes a random LoRA adapter for MODEL (catalog name or .gguf) in llama.cpp's GGUF form
(`convert_lora_to_gguf.py`'s layout: general.type adapter, adapter.type lora,
adapter.lora.alpha, `<tensor>.lora_a` [n_in, r] / `.lora_b` [r, n_out], F16 as
`convert_lora_to_gguf.py --outtype f16` writes them, or F32 with `--type f32`) on every
matrix whose name ends with a target, into a temporary directory, then:

- perplexity of the golden corpus (shared/golden/corpus/gpl3.txt, `--ctx` tokens per
  chunk) by `frink perplexity` and llama.cpp's `llama-perplexity` (ANCHOR.md's build;
  LLAMA_PERPLEXITY=/path) without the adapter, with it (`--lora`) and at scale 0.5
  (`--lora-scaled`): the two engines agree with and without the adapter alike;
- with `--speed`: decode t/s of 8 concurrent streams through `frink serve` (64 greedy
  tokens each, the same prompts) with no adapter, with one adapter on every stream, and
  with 8 different adapters (one per stream), as medians of 3 rounds.
"""
import argparse
import json
import os
import random
import struct
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frink_serve  # noqa: E402
import gguf_min as g  # noqa: E402
from ppl import CORPUS, FRINK, frink_ppl, llama_ppl, resolve  # noqa: E402


def write_adapter(base_path, targets, rank, alpha, amp, seed, path, ty="f16"):
    base = g.Reader(base_path)
    arch = base.kv["general.architecture"][1]
    kv = [("general.architecture", g.STRING, arch), ("general.type", g.STRING, "adapter"),
          ("adapter.type", g.STRING, "lora"), ("adapter.lora.alpha", g.F32, alpha)]
    rng = random.Random(seed)

    gt, fmt = (g.GGML_F16, "e") if ty == "f16" else (g.GGML_F32, "f")

    def rand(n):
        def fill(f, nbytes):
            vals = [rng.uniform(-amp, amp) for _ in range(n)]
            f.write(struct.pack(f"<{n}{fmt}", *vals))
        return fill

    tensors = []
    for name, dims, _, _ in base.tensors:
        if len(dims) != 2 or not any(name.endswith(t + ".weight") for t in targets):
            continue
        n_in, n_out = dims
        tensors.append((name + ".lora_a", [n_in, rank], gt, rand(n_in * rank)))
        tensors.append((name + ".lora_b", [rank, n_out], gt, rand(rank * n_out)))
    g.write(path, kv, tensors)
    return len(tensors) // 2


def serve_rate(model, flags, loras):
    """Aggregate decode t/s of 8 concurrent streams; `loras[i]` is stream i's `lora`."""
    p, port = frink_serve.start(FRINK, ["-m", model, "-t", "2", "--parallel", "8"] + flags)
    rates = []
    try:
        for rnd in range(3):
            done = [0] * 8

            def one(i):
                body = {"prompt": f"Story {rnd} number {i}: once upon a time", "max_tokens": 64,
                        "temperature": 0, "ignore_eos": True}
                if loras[i] is not None:
                    body["lora"] = loras[i]
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req) as r:
                    done[i] = json.load(r)["usage"]["completion_tokens"]

            t = time.time()
            ths = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            [th.start() for th in ths]
            [th.join() for th in ths]
            rates.append(sum(done) / (time.time() - t))
    finally:
        p.terminate()
        p.wait()
    return sorted(rates)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down")
    ap.add_argument("--type", choices=["f16", "f32"], default="f16")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--amp", type=float, default=0.06,
                    help="A and B uniform in +-amp (large enough to move the perplexity)")
    ap.add_argument("--speed", action="store_true")
    a = ap.parse_args()
    model = resolve(a.model)
    targets = a.targets.split(",")
    corpus = CORPUS
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, f"lora{i}.gguf") for i in range(8 if a.speed else 1)]
        for i, p in enumerate(paths):
            n = write_adapter(model, targets, a.rank, 2.0 * a.rank, a.amp, i, p, a.type)
        print(f"{os.path.basename(model)}: random rank-{a.rank} {a.type.upper()} adapters "
              f"on {n} matrices each")
        lora = paths[0]
        print("| adapter | frink PPL | llama.cpp PPL | ratio |")
        print("| --- | ---: | ---: | ---: |")
        for label, flags in [("none", []), ("scale 1", ["--lora", lora]),
                             ("scale 0.5", ["--lora-scaled", f"{lora}:0.5"])]:
            fr = frink_ppl(model, corpus, a.ctx, flags)
            ll = llama_ppl(model, corpus, a.ctx, flags)
            print(f"| {label} | {fr:.4f} | {ll:.4f} | {fr / ll:.4f} |")
        if a.speed:
            flags = sum((["--lora", p] for p in paths), []) + ["--lora-init-without-apply"]
            none = serve_rate(model, flags, [None] * 8)
            one = serve_rate(model, flags, [[{"id": 0, "scale": 1.0}]] * 8)
            eight = serve_rate(model, flags, [[{"id": i, "scale": 1.0}] for i in range(8)])
            print(f"8 streams: no adapter {none:.1f} t/s, one adapter {one:.1f} t/s "
                  f"({one / none:.2f}x), 8 adapters {eight:.1f} t/s ({eight / none:.2f}x)")


if __name__ == "__main__":
    main()
