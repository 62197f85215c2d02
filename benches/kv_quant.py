#!/usr/bin/env python3
"""The perplexity cost of each KV cache type, beside llama.cpp's own.

    python3 benches/kv_quant.py [-m MODEL ...] [--ctx 512] [--types q8_0,q4_0,...]

For each model (catalog names or .gguf files; default: qwen2.5-coder-0.5b, whose key
biases make it the hardest case, and smollm2-135m), the perplexity of the golden corpus
(shared/golden/corpus/gpl3.txt, `--ctx` tokens per chunk, 2 threads) by `frink perplexity`
with an f16 cache and with each type (`-ctk T -ctv T`, or `K/V` for keys and values of
different types), and by llama.cpp's llama-perplexity with `-fa on` (a quantized V cache
needs flash attention there; every one of its runs uses it) and the same `-ctk`/`-ctv`.
Prints each engine's change against its own f16 run; issue 55's bound is frink's change
within llama.cpp's + 0.5 points of a percent.

With `--kld`, also each engine's mean KL divergence (nats per token) from its own f16 run
and how often the top token stays the f16 run's (`--kl-divergence-base` written by the f16
run, `--kl-divergence` by the others; llama-perplexity's statistics): on this 3,570-token
corpus a perplexity change has an uncertainty near 0.7 points, the KL divergence one near
3% of its value, so the KL divergence tells two caches' damage apart where perplexity
cannot.
"""
import tempfile
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppl import (CORPUS, frink_kld, frink_kld_base, frink_ppl, llama_kld,  # noqa: E402
                 llama_kld_base, llama_ppl, resolve)

TYPES = "bf16,q8_0,q5_1,q5_0,q4_1,q4_0,iq4_nl,q8_0/q4_0"


def flags(t):
    k, v = (t.split("/") + [t])[:2]
    return ["-ctk", k, "-ctv", v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append",
                    default=None, help="repeatable (default: qwen2.5-coder-0.5b, smollm2-135m)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--types", default=TYPES, help=f"comma-separated (default {TYPES})")
    ap.add_argument("--kld", action="store_true", help="also the KL divergence from f16")
    a = ap.parse_args()
    models = a.model or ["qwen2.5-coder-0.5b", "smollm2-135m"]
    print(f"ctx {a.ctx}, {os.path.basename(CORPUS)}")
    extra = " frink KLD | llama.cpp KLD | frink same top | llama.cpp same top |" if a.kld else ""
    print("| model | K/V | frink | change | llama.cpp | change | frink - llama.cpp |" + extra)
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (4 if a.kld else 0))
    fa = ["-fa", "on"]
    with tempfile.TemporaryDirectory() as tmp:
        fbase, lbase = os.path.join(tmp, "frink.kld"), os.path.join(tmp, "llama.kld")
        for name in models:
            path = resolve(name)
            f16 = frink_ppl(path, CORPUS, a.ctx, flags("f16"))
            l16 = llama_ppl(path, CORPUS, a.ctx, fa + flags("f16"))
            if a.kld:
                frink_kld_base(path, CORPUS, a.ctx, flags("f16"), fbase)
                llama_kld_base(path, CORPUS, a.ctx, fa + flags("f16"), lbase)
            print(f"| {name} | f16 | {f16:.4f} | | {l16:.4f} | | |" + " |" * (4 if a.kld else 0),
                  flush=True)
            for t in a.types.split(","):
                f = frink_ppl(path, CORPUS, a.ctx, flags(t))
                ll = llama_ppl(path, CORPUS, a.ctx, fa + flags(t))
                df, dl = 100 * (f / f16 - 1), 100 * (ll / l16 - 1)
                row = (f"| {name} | {t} | {f:.4f} | {df:+.3f}% | {ll:.4f} | {dl:+.3f}% "
                       f"| {df - dl:+.3f} |")
                if a.kld:
                    fk = frink_kld(path, fbase, flags(t))
                    lk = llama_kld(path, lbase, a.ctx, fa + flags(t))
                    row += (f" {fk[0]:.5f} ± {fk[1]:.5f} | {lk[0]:.5f} ± {lk[1]:.5f} "
                            f"| {100 * fk[2]:.2f}% | {100 * lk[2]:.2f}% |")
                print(row, flush=True)


if __name__ == "__main__":
    main()
