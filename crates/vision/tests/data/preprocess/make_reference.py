#!/usr/bin/env python3
"""Pillow's Image.resize on 8-bit RGB, the reference of frink's resize (tests/preprocess.rs).

Inputs are a formula both sides compute: byte (x, y, c) = (37x + 91y + 53c + 7·((x·y) mod 17)) mod 256.
Writes resize.json: for each case the SHA-256 of Pillow's output bytes (row-major RGB).
Run with a Python that has Pillow (made with Pillow 13.0.0)."""
import hashlib
import json
from pathlib import Path

import PIL
from PIL import Image

CASES = [(45, 29, 32, 32), (20, 40, 32, 32), (17, 50, 32, 32), (640, 480, 224, 224), (7, 3, 96, 96),
         (20, 40, 40, 80), (33, 33, 64, 64), (100, 50, 64, 64), (64, 48, 48, 64), (300, 7, 30, 70)]
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}


def pattern(w, h):
    return bytes((37 * x + 91 * y + 53 * c + 7 * ((x * y) % 17)) % 256
                 for y in range(h) for x in range(w) for c in range(3))


out = {"pillow": PIL.__version__, "cases": []}
for iw, ih, ow, oh in CASES:
    im = Image.frombytes("RGB", (iw, ih), pattern(iw, ih))
    for name, f in FILTERS.items():
        data = im.resize((ow, oh), f).tobytes()
        out["cases"].append({"in": [iw, ih], "out": [ow, oh], "filter": name,
                             "sha256": hashlib.sha256(data).hexdigest()})
(Path(__file__).parent / "resize.json").write_text(json.dumps(out, indent=1))
