#!/usr/bin/env python3
"""A draft model cut from a model: its first N layers, its embeddings, output norm and LM
head, as stored (an early-exit "self-draft" of the same vocabulary, for `--draft-model`
when no smaller model of the family is at hand).

    python3 benches/draft_layers.py -m qwen2.5-coder-0.5b --layers 8 -o DRAFT.gguf
    frink bench -m qwen2.5-coder-0.5b -md DRAFT.gguf --spec-prompt-file PROMPT -n 256

The file is the model's metadata with `<arch>.block_count` = N and the tensors of the
layers past N left out; tensor bytes are copied unchanged.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_min  # noqa: E402
from ppl import resolve  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    src = resolve(a.model)
    r = gguf_min.Reader(src)
    arch = r.value("general.architecture")
    n = r.value(f"{arch}.block_count")
    if not 0 < a.layers <= n:
        sys.exit(f"--layers must be 1..{n}")
    kv = []
    for key, (ty, v) in r.kv.items():
        if key == f"{arch}.block_count":
            v = a.layers
        kv.append((key, ty, v))
    keep = []
    for name, dims, ty, off in r.tensors:
        m = re.match(r"blk\.(\d+)\.", name)
        if m and int(m.group(1)) >= a.layers:
            continue

        def fill(f, nbytes, off=off):
            with open(src, "rb") as g:
                g.seek(r.data_start + off)
                f.write(g.read(nbytes))
        keep.append((name, dims, gguf_min.LAYOUTS[ty], fill))
    gguf_min.write(a.out, kv, keep, r.value("general.alignment", 32))
    print(f"{a.out}: {a.layers} of {n} layers, {len(keep)} tensors, "
          f"{os.path.getsize(a.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
