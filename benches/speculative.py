#!/usr/bin/env python3
"""Speculative decoding against plain decoding: the same tokens, the decode rates.

    python3 benches/speculative.py [-m MODEL] [-n 384] [--prompts 10] [-t 2]
        [--only lookup,predicted,streams]

Code editing: functions of 40-80 lines taken from this Python's standard library (by
`ast`, the first `--prompts` in a fixed list of modules), each asked to be rewritten with
one small change (a renamed parameter), through the model's chat template, greedy, `-n`
tokens at most. Open-ended chat: five prompts with nothing to copy. Each prompt runs with
`frink run --spec off` and `--spec ngram`, alternating; the decode rate is
`gen_tokens / gen_ms` of `--json`, and the script checks that both gave the same ids.
Prints per-prompt rates and the median speedup of each set.

Predicted outputs (`predicted`): the same code edits through `frink serve --spec off
--parallel 1`, each without and with `prediction` = the unchanged function (OpenAI's
predicted outputs), alternating; the rate is `(completion_tokens - 1) / gen_ms` of the
response's `timings`, and the answers must be equal.

Server streams (`streams`): 8 concurrent requests (the code edits and the chat prompts,
128 tokens each) against `frink serve --parallel 8` with `--spec ngram` and with
`--spec off`, alternating rounds; the aggregate rate is all tokens over the wall time of a
round, and the ratio is the median over rounds (the answers must be equal).
"""
import argparse
import ast
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppl import FRINK, resolve  # noqa: E402
from frink_serve import start  # noqa: E402

MODULES = ["textwrap", "json.decoder", "json.encoder", "argparse", "shlex", "string",
           "difflib", "pprint", "csv", "configparser", "calendar", "tokenize", "ftplib",
           "gettext", "imaplib"]

CHAT = [
    "Write a short story about a lighthouse keeper who befriends a seal.",
    "Explain why the sky is blue to a ten-year-old.",
    "What are three good habits for staying healthy while working from home?",
    "Describe the plot of an imaginary film set on Mars in the year 3000.",
    "Give me some advice for learning to play the guitar as an adult.",
]


def functions(count):
    """(name, source, first parameter) of functions of 40-80 lines with a parameter."""
    out = []
    for mod in MODULES:
        try:
            src = inspect.getsource(importlib.import_module(mod))
        except (OSError, ImportError):
            continue
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.FunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
            if 40 <= lines <= 80 and params:
                body = "\n".join(src.splitlines()[node.lineno - 1:node.end_lineno])
                out.append((f"{mod}.{node.name}", textwrap.dedent(body), params[0]))
                break
        if len(out) == count:
            break
    return out


def run(model, prompt, n, threads, spec):
    out = subprocess.run([FRINK, "run", "-m", model, "--greedy", "-n", str(n), "-t", str(threads),
                          "--ctx", "4096", "--spec", spec, "--json", prompt],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr[-2000:])
    j = json.loads(out.stdout.strip().splitlines()[-1])
    t = j["timings"]
    return j["ids"], t["gen_tokens"] / (t["gen_ms"] / 1e3)


def compare(model, label, prompts, n, threads):
    ratios = []
    print(f"\n{label}")
    print("| prompt | tokens | off t/s | ngram t/s | speedup |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, prompt in prompts:
        ids_off, off = run(model, prompt, n, threads, "off")
        ids_on, on = run(model, prompt, n, threads, "ngram")
        if ids_on != ids_off:
            sys.exit(f"{name}: speculation changed the tokens")
        ratios.append(on / off)
        print(f"| {name} | {len(ids_on)} | {off:.1f} | {on:.1f} | {on / off:.2f}x |", flush=True)
    print(f"median speedup: {statistics.median(ratios):.2f}x")


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def predicted(model, edits, n, threads):
    print("\npredicted outputs (the unchanged function as the prediction), one stream")
    print("| prompt | tokens | plain t/s | predicted t/s | speedup | accepted | rejected |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    proc, port = start(FRINK, ["-m", model, "-t", str(threads), "--parallel", "1",
                               "--spec", "off", "--ctx", "4096"])
    ratios = []
    try:
        for name, prompt, src in edits:
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                    "temperature": 0}
            rates, answers = [], []
            for pred in (None, f"```python\n{src}\n```"):
                b = dict(body, prediction={"type": "content", "content": pred}) if pred else body
                r = post(port, b)
                toks = r["usage"]["completion_tokens"]
                rates.append((toks - 1) / (r["timings"]["gen_ms"] / 1e3))
                answers.append(r["choices"][0]["message"]["content"])
                d = r["usage"]["completion_tokens_details"]
            if answers[0] != answers[1]:
                sys.exit(f"{name}: the prediction changed the answer")
            ratios.append(rates[1] / rates[0])
            print(f"| {name} | {toks} | {rates[0]:.1f} | {rates[1]:.1f} | {rates[1] / rates[0]:.2f}x "
                  f"| {d['accepted_prediction_tokens']} | {d['rejected_prediction_tokens']} |",
                  flush=True)
    finally:
        proc.terminate()
    print(f"median speedup: {statistics.median(ratios):.2f}x")


def streams(model, prompts, threads, rounds=3):
    print("\n8 concurrent streams, --spec ngram vs --spec off (aggregate t/s per round)")
    servers = {spec: start(FRINK, ["-m", model, "-t", str(threads), "--parallel", "8",
                                   "--spec", spec, "--ctx", "4096"])
               for spec in ("off", "ngram")}
    ratios = []
    try:
        for rnd in range(rounds):
            rate, answers = {}, {}
            for spec in ("off", "ngram") if rnd % 2 == 0 else ("ngram", "off"):
                port = servers[spec][1]
                out = [None] * len(prompts)

                def one(i):
                    out[i] = post(port, {"messages": [{"role": "user", "content": prompts[i]}],
                                         "max_tokens": 128, "temperature": 0})
                t0 = time.time()
                ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                wall = time.time() - t0
                rate[spec] = sum(r["usage"]["completion_tokens"] for r in out) / wall
                answers[spec] = [r["choices"][0]["message"]["content"] for r in out]
            if answers["off"] != answers["ngram"]:
                sys.exit("speculation changed an answer among 8 streams")
            ratios.append(rate["ngram"] / rate["off"])
            print(f"round {rnd + 1}: off {rate['off']:.1f} t/s, ngram {rate['ngram']:.1f} t/s, "
                  f"{ratios[-1]:.3f}x", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
    print(f"median ratio: {statistics.median(ratios):.3f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-n", type=int, default=384)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--only", default="lookup,predicted,streams",
                    help="comma list of sections: lookup, predicted, streams")
    a = ap.parse_args()
    only = a.only.split(",")
    model = resolve(a.model)
    edits = [(name, f"Rewrite this Python function, renaming its parameter `{p}` to "
                    f"`{p}_value` everywhere. Reply with the complete function only.\n\n"
                    f"```python\n{src}\n```", src)
             for name, src, p in functions(a.prompts)]
    if "lookup" in only:
        compare(model, f"code editing ({len(edits)} functions of 40-80 lines)",
                [e[:2] for e in edits], a.n, a.threads)
        compare(model, "open-ended chat", [(f"chat {i}", p) for i, p in enumerate(CHAT)], 256,
                a.threads)
    if "predicted" in only:
        predicted(model, edits, a.n, a.threads)
    if "streams" in only:
        streams(model, [e[1] for e in edits[:3]] + CHAT, a.threads)


if __name__ == "__main__":
    main()
