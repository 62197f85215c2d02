#!/usr/bin/env python3
"""The perplexity cost of a Q8_0 KV cache, beside llama.cpp's own.

    python3 benches/kv_quant.py [-m MODEL ...] [--ctx 512]

For each model (catalog names or .gguf files; default: the three catalog models), the
perplexity of the golden corpus (shared/golden/corpus/gpl3.txt, `--ctx` tokens per chunk,
2 threads) by `frink perplexity --kv-type f16` and `--kv-type q8_0`, and by llama.cpp's
llama-perplexity with `-fa on` (a quantized V cache needs flash attention there; both of
its runs use it) and `-ctk f16 -ctv f16` / `-ctk q8_0 -ctv q8_0`. Prints each engine's
q8_0-vs-f16 change; the issue's bound is frink's change within llama.cpp's + 0.5%.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppl import CORPUS, frink_ppl, llama_ppl, resolve  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append",
                    default=None, help="repeatable (default: the catalog models)")
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    models = a.model or ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
    print(f"ctx {a.ctx}, {os.path.basename(CORPUS)}")
    print("| model | frink f16 | frink q8_0 | change | llama.cpp f16 | llama.cpp q8_0 | change |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in models:
        path = resolve(name)
        f16 = frink_ppl(path, CORPUS, a.ctx, ["--kv-type", "f16"])
        q8 = frink_ppl(path, CORPUS, a.ctx, ["--kv-type", "q8_0"])
        fa = ["-fa", "on"]
        l16 = llama_ppl(path, CORPUS, a.ctx, fa + ["-ctk", "f16", "-ctv", "f16"])
        l8 = llama_ppl(path, CORPUS, a.ctx, fa + ["-ctk", "q8_0", "-ctv", "q8_0"])
        print(f"| {name} | {f16:.4f} | {q8:.4f} | {100 * (q8 / f16 - 1):+.3f}% "
              f"| {l16:.4f} | {l8:.4f} | {100 * (l8 / l16 - 1):+.3f}% |", flush=True)


if __name__ == "__main__":
    main()
