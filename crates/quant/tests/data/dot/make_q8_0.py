"""Reference Q8_0 activation rows from gguf-py (gguf.quants.quantize, which follows
ggml's quantize_row_q8_0_ref: d = amax / 127, qs = roundf(x / d), d stored as f16).

Run with a python that has `gguf` and numpy: python make_q8_0.py
Writes q8_0.x.f32 (little-endian f32 input) and q8_0.gguf_py.raw (34-byte blocks).
"""
import numpy as np
from gguf import GGMLQuantizationType, quants

rng = np.random.default_rng(5)
blocks = [
    rng.standard_normal(32),                    # ordinary
    rng.standard_normal(32) * 1e-3,             # small
    rng.standard_normal(32) * 6e4,              # near f16 max in d * 127
    np.zeros(32),                               # all zero: d = 0, id = 0
    np.arange(-16, 16) + 0.5,                   # many x * id near .5 ties
    np.concatenate([[127.0], np.arange(31) - 15.5]),  # d = 1: exact ties round away from 0
    rng.standard_normal(32) * 1e-6,             # d below f16 min normal (subnormal)
    np.where(rng.random(32) < 0.5, -1.0, 1.0) * rng.random(32) * 3,
]
x = np.concatenate(blocks).astype(np.float32)
q = quants.quantize(x.reshape(1, -1), GGMLQuantizationType.Q8_0)
x.tofile("q8_0.x.f32")
np.asarray(q, dtype=np.uint8).tofile("q8_0.gguf_py.raw")
print(x.size, q.size)
