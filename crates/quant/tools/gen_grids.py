#!/usr/bin/env python3
"""Generate crates/quant/src/grids.rs from ggml's ggml-common.h.

The I-quant codebooks are facts of the file format: this script only carries the
numbers over. Usage:

    python3 crates/quant/tools/gen_grids.py PATH/TO/ggml-common.h [COMMIT] > crates/quant/src/grids.rs

If the Python package `gguf` (gguf-py) is importable, every table is also compared with
the independent copy gguf-py keeps in gguf/quants.py (stored there in a packed form), and
the script fails on any difference.
"""

import re
import sys

# (ggml name, C element type, expected length, Rust name, Rust type, values per line, hex?)
TABLES = [
    ("kmask_iq2xs", "uint8_t", 8, "KMASK_IQ2XS", "u8", 8, False),
    ("ksigns_iq2xs", "uint8_t", 128, "KSIGNS_IQ2XS", "u8", 16, False),
    ("kvalues_iq4nl", "int8_t", 16, "KVALUES_IQ4NL", "i8", 16, False),
    ("kvalues_fp4", "int8_t", 16, "KVALUES_MXFP4", "i8", 16, False),
    ("iq2xxs_grid", "uint64_t", 256, "IQ2XXS_GRID", "u64", 4, True),
    ("iq2xs_grid", "uint64_t", 512, "IQ2XS_GRID", "u64", 4, True),
    ("iq2s_grid", "uint64_t", 1024, "IQ2S_GRID", "u64", 4, True),
    ("iq3xxs_grid", "uint32_t", 256, "IQ3XXS_GRID", "u32", 8, True),
    ("iq3s_grid", "uint32_t", 512, "IQ3S_GRID", "u32", 8, True),
    ("iq1s_grid", "uint64_t", 2048, "IQ1S_GRID", "u64", 4, True),
]

DOCS = {
    "KMASK_IQ2XS": "Bit `j` set: `KMASK_IQ2XS[j] == 1 << j` (ggml `kmask_iq2xs`).",
    "KSIGNS_IQ2XS": "7 stored sign bits -> 8 sign bits with even parity: bit 7 is the parity "
    "of the low 7 (ggml `ksigns_iq2xs`). Bit `j` set means element `j` of a group of 8 is negated.",
    "KVALUES_IQ4NL": "The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml `kvalues_iq4nl`).",
    "KVALUES_MXFP4": "E2M1 (FP4) values, doubled so that they are integers (ggml `kvalues_fp4`, "
    "alias `kvalues_mxfp4`); MXFP4's scale is halved to compensate.",
    "IQ2XXS_GRID": "IQ2_XXS codebook: 256 entries of 8 magnitudes, one per byte, little-endian "
    "(byte `j` is element `j`) (ggml `iq2xxs_grid`).",
    "IQ2XS_GRID": "IQ2_XS codebook: 512 entries of 8 byte magnitudes, little-endian (ggml `iq2xs_grid`).",
    "IQ2S_GRID": "IQ2_S codebook: 1024 entries of 8 byte magnitudes, little-endian (ggml `iq2s_grid`).",
    "IQ3XXS_GRID": "IQ3_XXS codebook: 256 entries of 4 byte magnitudes, little-endian (ggml `iq3xxs_grid`).",
    "IQ3S_GRID": "IQ3_S codebook: 512 entries of 4 byte magnitudes, little-endian (ggml `iq3s_grid`).",
    "IQ1S_GRID": "IQ1_S / IQ1_M codebook: 2048 entries of 8 signed bytes in {-1, 0, 1}, "
    "little-endian (ggml `iq1s_grid`, the CPU variant).",
}


def extract(text, name, ctype, n):
    m = re.search(
        r"GGML_TABLE_BEGIN\(\s*" + re.escape(ctype) + r"\s*,\s*" + re.escape(name) + r"\s*,[^)]*\)(.*?)GGML_TABLE_END\(\)",
        text,
        re.S,
    )
    if not m:
        sys.exit(f"table {name} not found")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    vals = [int(tok, 0) for tok in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", body)]
    if len(vals) != n:
        sys.exit(f"table {name}: {len(vals)} values, expected {n}")
    return vals


def byte_rows(vals, width, signed):
    rows = []
    for v in vals:
        row = [(v >> (8 * j)) & 0xFF for j in range(width)]
        if signed:
            row = [b - 256 if b >= 128 else b for b in row]
        rows.append(row)
    return rows


def cross_check(tables):
    try:
        import numpy as np
        from gguf import quants
    except ImportError:
        print("gguf-py not importable: cross-check skipped", file=sys.stderr)
        return
    checks = [
        (quants.IQ2_XXS, "iq2xxs_grid", 8, False),
        (quants.IQ2_XS, "iq2xs_grid", 8, False),
        (quants.IQ2_S, "iq2s_grid", 8, False),
        (quants.IQ3_XXS, "iq3xxs_grid", 4, False),
        (quants.IQ3_S, "iq3s_grid", 4, False),
        (quants.IQ1_S, "iq1s_grid", 8, True),
    ]
    for cls, name, width, signed in checks:
        cls.init_grid()
        theirs = np.asarray(cls.grid, dtype=np.float32).reshape(-1, width)
        ours = np.array(byte_rows(tables[name], width, signed), dtype=np.float32)
        if theirs.shape != ours.shape or not np.array_equal(theirs, ours):
            sys.exit(f"{name}: differs from gguf-py's {cls.__name__} grid")
    if list(quants.IQ2_XXS.ksigns) != tables["ksigns_iq2xs"]:
        sys.exit("ksigns_iq2xs differs from gguf-py")
    if list(quants.IQ4_NL.kvalues) != tables["kvalues_iq4nl"]:
        sys.exit("kvalues_iq4nl differs from gguf-py")
    if list(quants.MXFP4.kvalues) != tables["kvalues_fp4"]:
        sys.exit("kvalues_fp4 differs from gguf-py")
    print("cross-check against gguf-py: all tables identical", file=sys.stderr)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    text = open(sys.argv[1]).read()
    commit = sys.argv[2] if len(sys.argv) == 3 else "unknown"
    tables = {t[0]: extract(text, t[0], t[1], t[2]) for t in TABLES}
    cross_check(tables)

    out = []
    w = out.append
    w("//! Codebooks and lookup tables of the ggml I-quants (generated; do not edit by hand).")
    w("//!")
    w("//! The numbers are facts of the file format, carried over from ggml's")
    w(f"//! `ggml/src/ggml-common.h` (ggml-org/ggml commit {commit}, file `src/ggml-common.h`)")
    w("//! by `crates/quant/tools/gen_grids.py`, which also checks them against the independent")
    w("//! copies in gguf-py (`gguf/quants.py`).")
    w("")
    w("/// Offset added to every IQ1_S codebook value before scaling (ggml `IQ1S_DELTA`).")
    w("pub const IQ1S_DELTA: f32 = 0.125;")
    w("/// Offset added to every IQ1_M codebook value before scaling (ggml `IQ1M_DELTA`).")
    w("pub const IQ1M_DELTA: f32 = 0.125;")
    for name, _ctype, n, rname, rtype, per_line, hexa in TABLES:
        vals = tables[name]
        w("")
        w(f"/// {DOCS[rname]}")
        w(f"pub static {rname}: [{rtype}; {n}] = [")
        digits = {"u64": 16, "u32": 8}.get(rtype, 0)
        for i in range(0, n, per_line):
            chunk = vals[i : i + per_line]
            if hexa:
                items = [f"0x{v:0{digits}x}" for v in chunk]
            else:
                items = [str(v) for v in chunk]
            w("    " + ", ".join(items) + ",")
        w("];")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
