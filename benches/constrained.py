#!/usr/bin/env python3
"""Decode speed of JSON-schema-constrained requests against the same requests unconstrained,
through `frink serve`, with 1 and 8 concurrent streams (issue 13's benchmark), and the
grammar's time per token from `/metrics` (`frink_grammar_mask_seconds_total` over
`frink_grammar_tokens_total`).

    python3 benches/constrained.py [-m MODEL] [-t 2] [-n 128] [-r 3]

Every request asks for `-n` greedy tokens; the schema (an array of exactly 64 short strings)
cannot be complete before them, so both kinds decode the same number of tokens. Each round
sends the unconstrained and the constrained batch alternately; medians over `-r` rounds.
Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frink_serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 12},
          "minItems": 64, "maxItems": 64}


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        text = r.read().decode()
    get = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))
    return get("frink_grammar_mask_seconds_total"), get("frink_grammar_tokens_total")


def batch(port, streams, n, constrained, round_no):
    """Aggregate decode t/s of `streams` concurrent requests."""
    results = [None] * streams

    def one(i):
        body = {"messages": [{"role": "user", "content":
                              f"List 64 animals, round {round_no}, stream {i}."}],
                "temperature": 0, "max_tokens": n}
        if constrained:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "animals", "schema": SCHEMA}}
        results[i] = post(port, body)

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    return tokens / wall, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default="smollm2-135m")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    a = ap.parse_args()
    srv, port = frink_serve.start(FRINK, ["-m", a.m, "-t", str(a.t), "--parallel", "8"])
    try:
        batch(port, 1, 8, True, -1)  # warm-up (also builds nothing lazily: a check)
        print(f"| {a.m} | streams | free t/s | constrained t/s | ratio | mask ms/token |")
        print("|---|---:|---:|---:|---:|---:|")
        for streams in (1, 8):
            free, cons, mask = [], [], []
            for r in range(a.r):
                free.append(batch(port, streams, a.n, False, r)[0])
                s0, k0 = metrics(port)
                tps, _ = batch(port, streams, a.n, True, r)
                s1, k1 = metrics(port)
                cons.append(tps)
                mask.append((s1 - s0) / max(k1 - k0, 1) * 1e3)
                print(f"round {r}, {streams} streams: free {free[-1]:.1f}, constrained "
                      f"{cons[-1]:.1f} t/s, mask {mask[-1]:.3f} ms/token", file=sys.stderr)
            f, c = statistics.median(free), statistics.median(cons)
            print(f"| | {streams} | {f:.1f} | {c:.1f} | {c / f:.2f} | "
                  f"{statistics.median(mask):.3f} |")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
