#!/usr/bin/env python3
"""Prompt-lookup speculation against plain decoding, one stream, same tokens.

    python3 benches/speculative.py [-m MODEL] [-n 384] [--prompts 10] [-t 2]

Code editing: functions of 40-80 lines taken from this Python's standard library (by
`ast`, the first `--prompts` in a fixed list of modules), each asked to be rewritten with
one small change (a renamed parameter), through the model's chat template, greedy, `-n`
tokens at most. Open-ended chat: five prompts with nothing to copy. Each prompt runs with
`frink run --spec off` and `--spec ngram`, alternating; the decode rate is
`gen_tokens / gen_ms` of `--json`, and the script checks that both gave the same ids.
Prints per-prompt rates and the median speedup of each set.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppl import FRINK, resolve  # noqa: E402

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-n", type=int, default=384)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    model = resolve(a.model)
    edits = [(name, f"Rewrite this Python function, renaming its parameter `{p}` to "
                    f"`{p}_value` everywhere. Reply with the complete function only.\n\n"
                    f"```python\n{src}\n```")
             for name, src, p in functions(a.prompts)]
    compare(model, f"code editing ({len(edits)} functions of 40-80 lines)", edits, a.n, a.threads)
    compare(model, "open-ended chat", [(f"chat {i}", p) for i, p in enumerate(CHAT)], 256,
            a.threads)


if __name__ == "__main__":
    main()
