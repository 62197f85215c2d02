"""The check the client scripts of crates/cli/tests share (structured_e2e.py, tools_e2e.py,
ollama_e2e.py; run by serve.rs): a failed check is printed and collected in `failures`,
and the script exits non-zero at its end when any failed."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)
