#!/usr/bin/env python3
"""The reference of frink's image preprocessing (crates/vision/tests/preprocess.rs): Pillow and
transformers' slow (PIL backend) image processors.

Writes, next to this script:
- pattern-WxH.png: the resize inputs, 8-bit RGB; byte (x, y, c) is
  (37x + 91y + 53c + 7·((x·y) mod 17)) mod 256, a formula the Rust test also computes;
- decode-*.{png,gif,webp,jpg}: one small picture in each format and pixel layout frink takes,
  and 16-bit PNGs written by hand (Pillow writes none in RGB);
- reference.json:
  - "resize": for each case and filter, the SHA-256 of Pillow's `Image.resize` output
    (row-major RGB bytes), and the bytes themselves (base64) for outputs of at most 32×32;
  - "decode": for each file, transformers' `convert_to_rgb(Image.open(f), return_numpy=True)`
    (transparency composited onto white) as base64 RGB bytes ("lossy": JPEG, which frink
    decodes with another decoder than Pillow's libjpeg-turbo);
  - "normalize": transformers' `rescale` then `normalize` (PIL backend) of a small image, as
    the bits of its float32 values, channel-first;
  - "processor": Gemma3ImageProcessorPil on a file, end to end (SHA-256 of the float32
    little-endian pixel values, and the first values).
Deterministic: run it again and nothing changes (made with Pillow 13.0.0, transformers 5.24.0,
as /work/vl/V/bin/python make_reference.py)."""
import base64
import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers.image_transforms import convert_to_rgb, normalize, rescale
from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN,
                                      OPENAI_CLIP_STD, ChannelDimension)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

HERE = Path(__file__).parent
# Up and down, non-integer ratios, one axis only, the same size, and both pass orders (Pillow 13
# goes vertical first when the height shrinks by more than twice as many pixels as the width:
# 20x40→32x32, 17x50→32x32, 17x50→3x1, 33x33→30x3; the others horizontal first).
CASES = [(45, 29, 32, 32), (20, 40, 32, 32), (17, 50, 32, 32), (640, 480, 224, 224), (7, 3, 896, 896),
         (7, 3, 96, 96), (20, 40, 40, 80), (33, 33, 64, 64), (100, 50, 64, 64), (64, 48, 48, 64),
         (300, 7, 30, 70), (1, 1, 5, 3), (45, 29, 45, 16), (45, 29, 13, 29), (45, 29, 45, 29),
         (17, 50, 3, 1), (64, 48, 32, 24), (33, 33, 30, 3)]
FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
           "lanczos": Image.LANCZOS}


def pattern(w, h):
    return bytes((37 * x + 91 * y + 53 * c + 7 * ((x * y) % 17)) % 256
                 for y in range(h) for x in range(w) for c in range(3))


def b64(data):
    return base64.b64encode(data).decode()


def png16(w, h, ctype, rows):
    """A 16-bit PNG (colour type `ctype`) of big-endian sample rows, written by hand."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0)
    data = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data, 9))
            + chunk(b"IEND", b""))


def resize_cases():
    out = []
    for iw, ih, ow, oh in CASES:
        name = f"pattern-{iw}x{ih}.png"
        im = Image.frombytes("RGB", (iw, ih), pattern(iw, ih))
        im.save(HERE / name, optimize=True)
        for fname, f in FILTERS.items():
            data = im.resize((ow, oh), f).tobytes()
            case = {"input": name, "in": [iw, ih], "out": [ow, oh], "filter": fname,
                    "sha256": hashlib.sha256(data).hexdigest()}
            if ow * oh <= 32 * 32:
                case["bytes"] = b64(data)
            out.append(case)
    return out


def decode_files():
    """Writes the decode inputs; returns their names."""
    w, h = 23, 17
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    # Smooth enough for the lossy codecs to keep it recognisable, with sharp edges too.
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([xx * 11, yy * 15, (xx + yy) * 6], -1).astype(np.uint8)
    smooth[5:9, 4:15] = (250, 20, 40)
    alpha = ((xx * 37 + yy * 53) % 256).astype(np.uint8)
    alpha[0, :4] = (0, 1, 254, 255)
    files = {}
    files["decode-rgb.png"] = Image.fromarray(rgb, "RGB")
    files["decode-grey.png"] = Image.fromarray(rgb[..., 0], "L")
    files["decode-la.png"] = Image.fromarray(np.stack([rgb[..., 1], alpha], -1), "LA")
    files["decode-rgba.png"] = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    pal = Image.fromarray(rgb, "RGB").quantize(16)
    files["decode-palette.png"] = pal
    files["decode-bilevel.png"] = Image.fromarray(rgb[..., 2] > 128).convert("1")
    names = []
    for name, im in files.items():
        im.save(HERE / name)
        names.append(name)
    # A palette with a transparent entry (tRNS), and the same as a GIF.
    pal.save(HERE / "decode-palette-trns.png", transparency=3)
    pal.save(HERE / "decode.gif", transparency=3)
    names += ["decode-palette-trns.png", "decode.gif"]
    Image.fromarray(np.dstack([smooth, alpha]), "RGBA").save(HERE / "decode-lossless.webp", lossless=True)
    Image.fromarray(smooth, "RGB").save(HERE / "decode-lossy.webp", quality=90)
    Image.fromarray(smooth, "RGB").save(HERE / "decode.jpg", quality=92)
    Image.fromarray(smooth[..., 0], "L").save(HERE / "decode-grey.jpg", quality=92)
    names += ["decode-lossless.webp", "decode-lossy.webp", "decode.jpg", "decode-grey.jpg"]
    # 16 bits a sample: values whose high and rounded bytes differ, and the ends.
    v = rng.integers(0, 65536, (h, w, 4)).astype(np.uint16)
    v[0, :6, :] = np.array([0, 127, 128, 255, 65407, 65535], dtype=np.uint16)[:, None]
    big = v.astype(">u2")
    for name, ctype, ch in [("decode-rgb16.png", 2, 3), ("decode-rgba16.png", 6, 4),
                            ("decode-grey16.png", 0, 1), ("decode-la16.png", 4, 2)]:
        sub = big[..., :ch].copy()
        if ch == 1:
            sub[1:, :, 0] //= 256  # Most of a grey16 image in 0..255, where Pillow keeps it.
        (HERE / name).write_bytes(png16(w, h, ctype, [sub[y].tobytes() for y in range(h)]))
        names.append(name)
    return names


def decode_cases(names):
    out = []
    for name in names:
        im = Image.open(HERE / name)
        rgb = convert_to_rgb(im, return_numpy=True)
        assert rgb.dtype == np.uint8 and rgb.shape[2] == 3, (name, rgb.dtype, rgb.shape)
        out.append({"file": name, "pillow_mode": im.mode, "size": [im.width, im.height],
                    "lossy": name.endswith(".jpg"), "rgb": b64(rgb.tobytes())})
    return out


def normalize_cases():
    w, h = 7, 5
    img = np.frombuffer(pattern(w, h), np.uint8).reshape(h, w, 3)
    chw = np.moveaxis(img, -1, 0)  # the PIL backend works channel-first
    out = []
    for scale, mean, std in [(1 / 255, IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD),
                             (1 / 255, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
                             (0.00392156862745098, [0.1, 0.2, 0.3], [0.7, 0.11, 1.3])]:
        x = rescale(chw, scale, data_format=ChannelDimension.FIRST, input_data_format=ChannelDimension.FIRST)
        x = normalize(x, mean, std, data_format=ChannelDimension.FIRST, input_data_format=ChannelDimension.FIRST)
        assert x.dtype == np.float32 and x.shape == (3, h, w)
        out.append({"size": [w, h], "rescale": scale, "mean": list(mean), "std": list(std),
                    "f32_bits": [int(b) for b in x.reshape(-1).view(np.uint32)]})
    return out


def processor_cases():
    out = []
    for name, size in [("decode-rgba.png", 32), ("pattern-640x480.png", 224), ("decode.gif", 40)]:
        proc = Gemma3ImageProcessorPil(size={"height": size, "width": size})
        px = proc(Image.open(HERE / name), return_tensors="np")["pixel_values"][0]
        assert px.dtype == np.float32 and px.shape == (3, size, size)
        out.append({"file": name, "size": size, "mean": list(proc.image_mean), "std": list(proc.image_std),
                    "rescale": proc.rescale_factor, "resample": "bilinear",
                    "sha256_f32le": hashlib.sha256(px.astype("<f4").tobytes()).hexdigest(),
                    "first": [float(v) for v in px.reshape(-1)[:8]]})
    return out


ref = {"pillow": PIL.__version__, "transformers": transformers.__version__,
       "resize": resize_cases(), "decode": decode_cases(decode_files()),
       "normalize": normalize_cases(), "processor": processor_cases()}
(HERE / "reference.json").write_text(json.dumps(ref, indent=0) + "\n")
