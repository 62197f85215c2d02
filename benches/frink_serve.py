"""Starting `frink serve` for the benchmark scripts: on a free port (`--port 0`), waiting
for its "ready on" line, its stderr drained afterwards so it never blocks."""
import re
import subprocess
import sys
import threading


def start(frink, args):
    """Starts `frink serve --port 0 ARGS…`; returns (process, port), or exits when the
    server does not come up."""
    proc = subprocess.Popen([frink, "serve", "--port", "0"] + list(args),
                            stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("frink serve did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port
