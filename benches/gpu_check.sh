#!/usr/bin/env bash
# The GPU check: every GPU test and measurement, run in one go on a machine with an NVIDIA
# GPU (and no Rust toolchain), in well under four minutes.
#
#   benches/gpu_check.sh prepare    on the build machine: builds the release binary, the GPU
#                                   test binaries and the probe, strips them into
#                                   target/gpu-check/ (the folder to carry, under 64 MiB)
#   benches/gpu_check.sh run [OUT]  on the GPU machine, from the checkout's root: runs them
#                                   and writes OUT/gpu_check.json (OUT: $OUT, else
#                                   /tmp/gpu-check), with each step's log beside it
#
# What `run` does: `frink devices --json`; the NVRTC compile check of every kernel for
# sm_80/86/89/90 with the machine's own NVRTC (no spills); the kernel tests against the CPU
# on the GPU (`FRINK_TEST_CUDA=1`: a missing GPU fails); the probe (read bandwidth, launch
# cost, the products at Llama-3.1-8B's shapes as a fraction of the bandwidth).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=target/gpu-check

prepare() {
  set -e
  cargo build --release -p frink
  cargo build --release -p frink-cuda --example gpu_probe
  mkdir -p "$DIR"
  # The test executables cargo builds (their paths from cargo's JSON messages).
  cargo test --release -p frink-cuda --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$DIR"
  cp target/release/frink target/release/examples/gpu_probe "$DIR/"
  strip "$DIR"/* 2>/dev/null || true
  du -sh "$DIR"
  ls -la "$DIR"
  echo "carry: $DIR"
}

run() {
  OUT=${1:-${OUT:-/tmp/gpu-check}}
  mkdir -p "$OUT"
  local t0=$SECONDS
  "$DIR/frink" devices --json > "$OUT/devices.json" 2> "$OUT/devices.log"
  # The machine's own NVRTC for the compile check (the loader's, else the toolkit's).
  NVRTC=$(ldconfig -p 2>/dev/null | awk '/libnvrtc\.so\.[0-9]+ /{print $NF; exit}')
  [ -z "$NVRTC" ] && NVRTC=$(ls /usr/local/cuda*/lib64/libnvrtc.so.* 2>/dev/null | head -1)
  CI=true FRINK_TEST_NVRTC="$NVRTC" timeout 120 "$DIR/nvrtc_compile" --test-threads 1 --nocapture \
    > "$OUT/nvrtc_compile.log" 2>&1
  local nvrtc_rc=$?
  FRINK_TEST_CUDA=1 timeout 120 "$DIR/gpu_ops" --test-threads 1 --nocapture \
    > "$OUT/gpu_ops.log" 2>&1
  local ops_rc=$?
  timeout 120 "$DIR/gpu_probe" > "$OUT/probe.json" 2> "$OUT/probe.log"
  local probe_rc=$?
  python3 - "$OUT" "$nvrtc_rc" "$ops_rc" "$probe_rc" "$((SECONDS - t0))" <<'EOF'
import json, os, sys
out, nvrtc_rc, ops_rc, probe_rc, secs = sys.argv[1], *map(int, sys.argv[2:])
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception as e:
        return {"error": f"{name}: {e}"}
def tail(name, n=40):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().splitlines()[-n:]
    except Exception as e:
        return [str(e)]
summary = {
    "seconds": secs,
    "devices": load("devices.json"),
    "nvrtc_compile": {"passed": nvrtc_rc == 0, "log_tail": tail("nvrtc_compile.log", 12)},
    "gpu_ops": {"passed": ops_rc == 0, "log_tail": tail("gpu_ops.log")},
    "probe": load("probe.json") if probe_rc == 0 else {"error": tail("probe.log")},
}
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps({k: (v["passed"] if isinstance(v, dict) and "passed" in v else v)
                  for k, v in summary.items() if k != "devices"}, indent=1))
EOF
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 prepare | run [OUT]" >&2; exit 2 ;;
esac
