#!/usr/bin/env python3
"""Write the reference rows in crates/quant/tests/data/ with independent implementations.

Usage (see tests/data/README.md for the exact environment):

    python3 crates/quant/tools/make_test_data.py SHARED_FIXTURES_QUANT_DIR OUT_DIR

Every case is 4 rows: `<name>.raw` holds the stored blocks, `<name>.f32.bin` the values
(float32 little-endian, row-major [4][row_elements]) computed by gguf-py's
`gguf.quants.dequantize` (or, for Q8_K, which gguf-py lacks, by the one-line numpy rule
`d * qs`). `manifest.json` lists the cases.
"""

import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROWS = 4
ROW = 256  # elements per row: a multiple of every block size
QK_K = 256

# Byte offsets of the f16 scale fields of each type (ggml-common.h block structs), which
# random cases overwrite with finite values so that no NaN or infinity is dequantized.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ1_M: [], T.IQ4_NL: [0], T.IQ4_XS: [0],
    T.TQ1_0: [52], T.TQ2_0: [64], T.MXFP4: [],
}


def write_case(out_dir, manifest, name, qtype, raw, values, source):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    values = np.ascontiguousarray(values, dtype="<f4")
    assert values.shape == (ROWS, values.shape[1])
    block, size = GGML_QUANT_SIZES[qtype]
    assert raw.nbytes == ROWS * values.shape[1] // block * size
    raw.tofile(os.path.join(out_dir, f"{name}.raw"))
    values.tofile(os.path.join(out_dir, f"{name}.f32.bin"))
    manifest.append({
        "name": name,
        "type": qtype.name,
        "rows": ROWS,
        "row_elements": int(values.shape[1]),
        "raw_file": f"{name}.raw",
        "f32_file": f"{name}.f32.bin",
        "source": source,
    })


def finite_bits(rng, n, exp_mask, dtype):
    """n random bit patterns of an IEEE type, with the all-ones exponent avoided."""
    width = np.dtype(dtype).itemsize * 8
    bits = rng.integers(0, 1 << width, size=n, dtype=np.uint64).astype(dtype)
    bad = (bits & dtype(exp_mask)) == exp_mask
    bits[bad] ^= dtype(exp_mask & -exp_mask)  # clear the lowest exponent bit
    assert not ((bits & dtype(exp_mask)) == exp_mask).any()
    return bits


def random_blocks(rng, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * ROW // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.IQ1_M:
        # The f16 super-scale is bits 12..15 of the four u16 scale words; clearing bit 14
        # of it (byte 55, bit 6) keeps its exponent below the all-ones pattern.
        raw[:, 55] &= 0xBF
    return raw.reshape(ROWS, -1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fixtures, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    manifest = []

    # 1. IQ2_S from a real file: the first IQ2_S tensor of quant/IQ3_XXS/llama.gguf.
    path = os.path.join(fixtures, "IQ3_XXS", "llama.gguf")
    reader = GGUFReader(path)
    t = next(t for t in reader.tensors if t.tensor_type == T.IQ2_S)
    ne0 = int(t.shape[0])
    raw = np.asarray(t.data).reshape(-1, t.data.shape[-1])[:ROWS]
    values = quants.dequantize(raw, T.IQ2_S)
    write_case(out_dir, manifest, "iq2_s.llama", T.IQ2_S, raw, values.reshape(ROWS, ne0),
               f"first {ROWS} rows of {t.name} (IQ2_S, ne0 {ne0}) in shared/fixtures/quant/IQ3_XXS/llama.gguf; "
               "values: gguf-py gguf.quants.dequantize")

    # 2. Types gguf-py can quantize that have no fixture rows: quantize normal data.
    rng = np.random.default_rng(20240917)
    for qtype in (T.TQ1_0, T.TQ2_0, T.MXFP4):
        x = rng.standard_normal((ROWS, ROW)).astype(np.float32)
        raw = quants.quantize(x, qtype)
        values = quants.dequantize(raw, qtype)
        write_case(out_dir, manifest, f"{qtype.name.lower()}.quantized", qtype, raw, values,
                   "gguf-py gguf.quants.quantize of seeded N(0,1) data, then gguf.quants.dequantize")

    # 3. Random bytes for every block type (scale fields made finite): every bit pattern of
    # every field, beyond what a quantizer writes.
    rng = np.random.default_rng(7)
    for qtype in F16_FIELDS:
        raw = random_blocks(rng, qtype)
        values = quants.dequantize(raw, qtype)
        write_case(out_dir, manifest, f"{qtype.name.lower()}.random", qtype, raw, values,
                   "seeded random bytes, f16 scale fields replaced by finite values; values: gguf-py gguf.quants.dequantize")
    for qtype, exp_mask, dtype in ((T.F16, 0x7C00, np.uint16), (T.BF16, 0x7F80, np.uint16), (T.F32, 0x7F800000, np.uint32)):
        bits = finite_bits(rng, ROWS * ROW, exp_mask, dtype).astype(f"<u{np.dtype(dtype).itemsize}")
        raw = bits.view(np.uint8).reshape(ROWS, -1)
        values = quants.dequantize(raw, qtype) if qtype != T.F32 else bits.view("<f4")
        write_case(out_dir, manifest, f"{qtype.name.lower()}.random", qtype, raw, np.asarray(values).reshape(ROWS, ROW),
                   "seeded random bit patterns (no Inf/NaN); values: gguf-py gguf.quants.dequantize"
                   + (" (F32: the bits themselves)" if qtype == T.F32 else ""))

    # 4. Q8_K (no gguf-py support): random int8 quants, finite f32 scales, consistent bsums;
    # values by numpy: d * float32(qs).
    n_blocks = ROWS * ROW // QK_K
    d = (rng.standard_normal(n_blocks) * 0.01).astype("<f4")
    qs = rng.integers(-128, 128, size=(n_blocks, QK_K), dtype=np.int8)
    bsums = qs.reshape(n_blocks, QK_K // 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16).astype("<i2")
    raw = np.concatenate([d.reshape(-1, 1).view(np.uint8), qs.view(np.uint8), bsums.view(np.uint8)], axis=1)
    values = (d.reshape(-1, 1) * qs.astype(np.float32)).reshape(ROWS, ROW)
    write_case(out_dir, manifest, "q8_k.random", T.Q8_K, raw.reshape(ROWS, -1), values,
               "seeded random int8 quants and f32 scales; values: numpy float32 d * qs")

    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump({"rows": ROWS, "cases": manifest}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
