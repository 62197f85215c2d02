#!/usr/bin/env python3
"""Is frink's default decode path the fastest on this machine? A benchmark report, not a
timed test.

For each model it runs `frink bench -p 0 -n N -r R --json` with every decode path forced
(`--no-repack`: the stored rows; `--prefetch nta|t0|t1`: the repacked weights with that
software-prefetch hint) and with the default (the path frink measured and cached for this
CPU and file shape, measuring it first if the cache has none), alternating the variants
for `--rounds` rounds (the machine's speed drifts; alternating keeps a round's figures
under the same conditions), and prints per model the median tg t/s of each variant, the
path the default ran (from the JSON's `decode_path`) and the default's ratio to the
fastest forced path. It exits 1 when the default is more than `--tolerance` (5%) slower
than the fastest forced path on any model.

    python3 benches/decode_paths.py [-t 2] [-n 128] [-r 2] [--rounds 3] [MODEL ...]

MODEL is a catalog name or a .gguf path (default: the three catalog models, and the
Qwen2.5-1.5B-shaped Q4_K_M and Q4_0 files of benches/real_shapes.py when present).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))

VARIANTS = [
    ("default", []),
    ("stored", ["--no-repack"]),
    ("packed/nta", ["--prefetch", "nta"]),
    ("packed/t0", ["--prefetch", "t0"]),
    ("packed/t1", ["--prefetch", "t1"]),
]


def default_models():
    models = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
    home = os.environ.get("FRINK_HOME") or os.path.expanduser("~/.cache/frink")
    for q in ["Q4_K_M", "Q4_0"]:
        p = os.path.join(home, "bench", f"qwen2.5-1.5b-{q}.gguf")
        if os.path.exists(p):
            models.append(p)
    return models


def bench(model, flags, args):
    cmd = [FRINK, "bench", "-m", model, "-p", "0", "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "--json"] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    row = json.loads([l for l in r.stdout.strip().splitlines() if l.strip()][-1])[0]
    return row["avg_ts"], row.get("decode_path", "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("models", nargs="*")
    args = ap.parse_args()
    models = args.models or default_models()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"CPU: {cpu}; {args.t} threads; tg{args.n}, -r {args.r}, {args.rounds} rounds (medians)")
    print("| model | default (path) | stored | packed/nta | packed/t0 | packed/t1 | default / fastest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    failed = []
    for m in models:
        ts = {name: [] for name, _ in VARIANTS}
        chosen = set()
        for rnd in range(args.rounds):
            for name, flags in VARIANTS:
                t, path = bench(m, flags, args)
                ts[name].append(t)
                if name == "default":
                    chosen.add(path)
                print(f"  round {rnd + 1} {os.path.basename(m)} {name}: {t:.2f} t/s ({path})",
                      file=sys.stderr)
        med = {k: statistics.median(v) for k, v in ts.items()}
        forced = {k: v for k, v in med.items() if k != "default"}
        best_name = max(forced, key=forced.get)
        ratio = med["default"] / forced[best_name]
        cells = " | ".join(f"{med[k]:.2f}" for k in ["stored", "packed/nta", "packed/t0", "packed/t1"])
        print(f"| {os.path.basename(m)} | {med['default']:.2f} ({', '.join(sorted(chosen))}) | "
              f"{cells} | {ratio:.3f} (fastest: {best_name}) |")
        if ratio < 1 - args.tolerance:
            failed.append(f"{m}: default {med['default']:.2f} t/s is {ratio:.3f} of "
                          f"{best_name} {forced[best_name]:.2f}")
    if failed:
        print("\nthe default is more than {:.0%} slower than a forced path:\n  {}".format(
            args.tolerance, "\n  ".join(failed)))
        sys.exit(1)
    print(f"\nthe default is within {args.tolerance:.0%} of the fastest forced path everywhere")


if __name__ == "__main__":
    main()
