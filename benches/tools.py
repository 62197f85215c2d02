"""What the bench scripts need before they start, said plainly instead of a traceback."""
import os
import shutil
import sys


def require_program(path, what, how):
    """Exit with a one-line message unless `path` (a path or a name on PATH) runs."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    found = shutil.which(path)
    if found:
        return found
    sys.exit(f"{what} not found at {path}: {how}")


FRINK_HOW = "build it with `cargo build --release`, or set FRINK=/path/to/frink"
LLAMA_HOW = ("install llama.cpp beside frink as docs/speed.md says "
             "(\"The llama.cpp beside it\"), or set LLAMA_BENCH/LLAMA_SERVER")
