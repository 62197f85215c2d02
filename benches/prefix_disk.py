#!/usr/bin/env python3
"""Time to first token for a long shared prefix: cold, from the memory prefix cache, and
from the disk tier (`frink serve --cache-disk`).

    python3 benches/prefix_disk.py [-m MODEL.gguf] [-t 2] [--tokens 16000]

Starts `frink serve` (target/release/frink, or FRINK=/path) with one slot whose KV pool
holds one long prompt (`--kv-size` = `--ctx` = tokens + 512) and a disk tier in a
temporary folder, then sends `/completion` requests of one token each, timing each
(the whole request: the first token is its only token):

1. prefix P + question 1: cold, every token evaluated;
2. P + question 2: P's blocks from the memory cache;
3. another prefix Q: its blocks take P's, which go to disk;
4. P + question 3: P's blocks read back from disk.

Prints the four times, the tokens each evaluated (`timings.prompt_n`) and the ratios
against the cold time.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from tools import FRINK_HOW, require_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_compare import free_port, wait_ready  # noqa: E402


def complete(url, prompt):
    body = json.dumps({"prompt": prompt, "n_predict": 1, "temperature": 0,
                       "cache_prompt": True}).encode()
    req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        v = json.loads(r.read())
    return time.time() - t0, v["timings"]["prompt_n"], v["tokens_cached"]


def text(seed, words):
    colours = ["red", "green", "blue", "old", "new", "tall"]
    return " ".join(f"entry {seed}-{k} is the {colours[(k * seed) % 6]} one."
                    for k in range(words // 6))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default=os.path.expanduser(
        "~/.cache/frink/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16000)
    a = ap.parse_args()
    frink = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
    require_program(frink, "frink", FRINK_HOW)
    # About 2.1 tokens a word in these lines with qwen2.5's tokenizer.
    words = int(a.tokens / 2.14)
    p, q = text(3, words), text(7, words)
    ctx = a.tokens + 1024
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as disk:
        proc = subprocess.Popen(
            [frink, "serve", "-m", a.m, "-t", str(a.t), "--port", str(port), "--parallel", "1",
             "--ctx", str(ctx), "--kv-size", str(ctx), "--cache-disk", disk,
             "--cache-disk-size", "8G"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(url, proc)
            rows = []
            for name, prompt in [("cold", p + " Question 1?"), ("memory", p + " Question 2?"),
                                 ("other prefix", q + " Question 1?"),
                                 ("disk", p + " Question 3?")]:
                s, evaluated, cached = complete(url, prompt)
                rows.append((name, s, evaluated, cached))
                print(f"{name:13s} {s:8.2f} s  {evaluated:6d} evaluated  {cached:6d} reused",
                      flush=True)
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("frink_cache_disk_hits_total"):
                        print(f"blocks read from disk: {line.rsplit(' ', 1)[1]}")
            cold = rows[0][1]
            for name, s, _, _ in rows[1:]:
                if name != "other prefix":
                    print(f"{name}: {s / cold:.1%} of the cold time")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
