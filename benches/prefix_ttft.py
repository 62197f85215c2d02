#!/usr/bin/env python3
"""Time to first token with a shared system prompt: the prefix cache at work.

    python3 benches/prefix_ttft.py [-m MODEL.gguf] [-t 2] [--words 1100] [--requests 16]
                                   [--concurrent]

Starts `frink serve` (target/release/frink, or FRINK=/path) on a loopback port and sends
`--requests` streamed chat requests that share one long system prompt (about 1.4 tokens a
word with smollm2's tokenizer: 1100 words are about 1,500 tokens) and differ in the user's
question, one after another (or all at once with --concurrent). Prints each request's
time to first token, the prompt tokens the server evaluated and reused (from
`/metrics`: `frink_prompt_tokens_total` minus `frink_prompt_tokens_cached_total`), and
the last request's time to first token as a fraction of the first's.
"""
import argparse
import json
import os
import subprocess

from tools import FRINK_HOW, require_program
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_compare import free_port, wait_ready  # noqa: E402


def metrics(url):
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and " " in line:
                k, v = line.rsplit(" ", 1)
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def ttft(url, system, i):
    body = json.dumps({
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": f"Question {i}: what is item {i * 13 % 997}?"}],
        "max_tokens": 4, "temperature": 0, "stream": True,
    }).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.time() - t0
                r.read()
                return first
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default=os.path.expanduser(
        "~/.cache/frink/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--words", type=int, default=1100)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrent", action="store_true")
    a = ap.parse_args()
    frink = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
    require_program(frink, "frink", FRINK_HOW)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([frink, "serve", "-m", a.m, "-t", str(a.t), "--port", str(port),
                             "--parallel", "4", "--ctx", "4096", "--queue", str(4 * a.requests)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        words = " ".join(f"item {k} is the {['red', 'green', 'blue', 'old'][k % 4]} one."
                         for k in range(a.words // 6))
        system = "You are a careful assistant. Facts: " + words
        m0 = metrics(url)
        times = [0.0] * a.requests
        if a.concurrent:
            def one(i):
                times[i] = ttft(url, system, i)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for i in range(a.requests):
                times[i] = ttft(url, system, i)
        m1 = metrics(url)
        total = m1["frink_prompt_tokens_total"] - m0["frink_prompt_tokens_total"]
        cached = m1["frink_prompt_tokens_cached_total"] - m0["frink_prompt_tokens_cached_total"]
        print("time to first token (s): " + " ".join(f"{t:.3f}" for t in times))
        print(f"prompt tokens: {total:.0f} in {a.requests} requests, {total - cached:.0f} "
              f"evaluated, {cached:.0f} from the prefix cache")
        print(f"request {a.requests}'s time to first token: {times[-1] / times[0]:.1%} of the first's")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
