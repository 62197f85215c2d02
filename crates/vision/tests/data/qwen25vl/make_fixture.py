#!/usr/bin/env python3
"""Tiny random-weight Qwen2.5-VL vision-language fixture, transformers (fp32) as the reference.

Extends the project's fixture generator (shared/tools/fixtures/gen_fixtures.py: its tiny byte-level BPE
tokenizer and its perturbation of constant parameters) to Qwen2_5_VLForConditionalGeneration (a ViT with
2D rotary positions, window attention on some layers and a 2 × 2 patch merger; a Qwen2 language model
with multimodal rotary positions, M-RoPE), converted with llama.cpp's convert_hf_to_gguf.py twice: the
language model (model.gguf) and the projector (--mmproj: mmproj-model.gguf). The processor resizes an
image to multiples of patch × merge within [min_pixels, max_pixels] (smart_resize), as Qwen2.5-VL's does,
at a tiny scale (4-pixel patches, windows of 2 × 2 merged units).

Run (see README.md beside this file):
  LLAMA_CPP_DIR=<llama.cpp source tree> SHARED_FIXTURES=<shared/tools/fixtures> FIXTURE_WORK=/tmp/fx \
    <python with torch, transformers 5.24, pillow, tokenizers, safetensors> make_fixture.py
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

OUT = Path(__file__).resolve().parent
LLAMA_CPP = Path(os.environ["LLAMA_CPP_DIR"])
sys.path.insert(0, os.environ["SHARED_FIXTURES"])
import gen_fixtures as G  # noqa: E402  (its tokenizer and perturbation helpers)

WORK = G.WORK / "qwen25vl_vision"
SEED = 2525
PATCH, TEMPORAL, MERGE = 4, 2, 2
WINDOW = 16  # pixels: 16 // MERGE // PATCH = 2 × 2 merged units per window
FULLATT = [1, 3]  # layers 0 and 2 attend within windows, 1 and 3 over the whole image
MROPE = [2, 3, 3]  # temporal, height, width rotation pairs: head_dim / 2 = 8
MIN_PIXELS, MAX_PIXELS = 16 * 16, 48 * 48  # square.png sits on max_pixels, big.png is scaled down
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2.5-VL-Instruct's chat template (Qwen/Qwen2.5-VL-7B-Instruct, chat_template.json), as published.
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def f32(path: Path, a) -> list:
    a = np.asarray(a, dtype="<f4")
    a.tofile(path)
    return list(a.shape)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def test_images():
    """An even grid, an odd grid (partial windows), a resize by rounding, a resize down to max_pixels."""
    rng = np.random.default_rng(SEED)

    def save(name, h, w, f):
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack(f(x, y), -1) + rng.integers(0, 40, (h, w, 3))
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB").save(OUT / name)

    save("square.png", 48, 48, lambda x, y: [x * 5, y * 5, (x + y) * 3])
    save("odd.png", 56, 40, lambda x, y: [(x * 7) % 256, 255 - y * 4, x + y])
    save("wide.png", 21, 70, lambda x, y: [255 - x * 3, y * 10, (x * y) % 256])
    save("big.png", 52, 60, lambda x, y: [(x * y) % 256, x * 2, 255 - y * 3])
    return ["square.png", "odd.png", "wide.png", "big.png"]


def build_tokenizer(hf_dir: Path):
    from transformers import AutoTokenizer
    src = G.build_bpe(320)
    tok = AutoTokenizer.from_pretrained(src)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    # As Qwen2.5-VL's tokenizer: no BOS, the turn end as EOS, <|endoftext|> as padding.
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = TEMPLATE
    tok.save_pretrained(hf_dir)
    return tok, {t: tok.convert_tokens_to_ids(t) for t in ["<|endoftext|>"] + SPECIAL}


def image_only_processor():
    """Qwen2_5_VLProcessor without its video processor, whose class needs torchvision (not needed for images):
    the processor's sub-processors are the parameters of its __init__."""
    from transformers import Qwen2_5_VLProcessor

    class ImageOnlyProcessor(Qwen2_5_VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlyProcessor


def main():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize
    from transformers.vision_utils import get_vision_window_index
    import transformers

    shutil.rmtree(WORK, ignore_errors=True)
    hf_dir = WORK / "hf"
    hf_dir.mkdir(parents=True)
    tok, ids = build_tokenizer(hf_dir)
    vocab = len(tok)
    text_cfg = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE},
        tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], initializer_range=0.15, max_position_embeddings=4096)
    vision_cfg = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, hidden_act="silu", in_channels=3,
                      patch_size=PATCH, temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, window_size=WINDOW,
                      fullatt_block_indexes=FULLATT, out_hidden_size=64,
                      rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    cfg = Qwen2_5_VLConfig(text_config=text_cfg, vision_config=vision_cfg, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    torch.manual_seed(SEED)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    touched = G.perturb_constant_params(model, 0.1, torch.Generator().manual_seed(SEED + 17))
    with torch.no_grad():  # the tower's default init is small: widen so every part matters
        for n, p in model.named_parameters():
            if ".visual." in f".{n}" and p.dim() >= 2:
                p.normal_(0, 0.15, generator=torch.Generator().manual_seed(SEED + zlib.crc32(n.encode()) % 1000))
    model.save_pretrained(hf_dir)
    improc = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH,
                                      temporal_patch_size=TEMPORAL, merge_size=MERGE)
    proc = image_only_processor()(improc, tok, chat_template=TEMPLATE)
    proc.save_pretrained(hf_dir)
    tok = proc.tokenizer

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    visual = model.model.visual
    names = test_images()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": SEED,
            "image_processor": type(improc).__name__, "special_token_ids": ids, "vocab_size": vocab,
            "text_config": text_cfg, "vision_config": vision_cfg,
            "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "resize_factor": PATCH * MERGE,
            "resample": improc.resample.name,
            "image_mean": list(improc.image_mean), "image_std": list(improc.image_std),
            "rescale_factor": improc.rescale_factor,
            "perturbed": touched, "images": {}, "prompts": {}}
    # smart_resize on more sizes than the images: (h, w) -> (h', w'), every branch of it.
    meta["smart_resize"] = [[h, w, *smart_resize(h, w, factor=PATCH * MERGE, min_pixels=MIN_PIXELS,
                                                  max_pixels=MAX_PIXELS)]
                            for h, w in [(48, 48), (56, 40), (21, 70), (52, 60), (49, 49), (8, 8), (3, 30), (12, 12),
                                         (100, 100), (200, 13), (64, 64), (20, 20), (36, 36), (44, 52)]]

    def image_features(pixels, grid):
        with torch.no_grad():
            return torch.cat(model.model.get_image_features(pixel_values=pixels, image_grid_thw=grid).pooler_output)

    @contextlib.contextmanager
    def full_attention():
        """Every vision layer attends over the whole image: what llama.cpp computes from mmproj-model.gguf,
        which carries no window size (clip.cpp then assumes 112 pixels, wider than every image here)."""
        visual.fullatt_block_indexes = list(range(len(visual.blocks)))
        try:
            yield
        finally:
            visual.fullatt_block_indexes = FULLATT

    for n in names:
        im = Image.open(OUT / n)
        out = improc(images=im, return_tensors="pt")
        px, grid = out["pixel_values"], out["image_grid_thw"]  # [n_patches][3 × 2 × 4 × 4], [1][3]
        stem = n.split(".")[0]
        feats = image_features(px, grid)  # [n_patches / 4][64], the merged units row by row
        with full_attention():
            full = image_features(px, grid)
        widx, cu = get_vision_window_index(grid, spatial_merge_size=MERGE, window_size=WINDOW, patch_size=PATCH)
        t, gh, gw = grid[0].tolist()
        meta["images"][n] = {
            "size_hw": [im.height, im.width], "resized_hw": [gh * PATCH, gw * PATCH], "grid_thw": [t, gh, gw],
            "merged_hw": [gh // MERGE, gw // MERGE],
            "pixels": f32(OUT / f"{stem}.pixels.bin", px.numpy()),
            "embeds": f32(OUT / f"{stem}.embeds.bin", feats.numpy()),
            "embeds_full_attention": f32(OUT / f"{stem}.embeds_full.bin", full.numpy()),
            "window_index": widx.tolist(), "cu_window_seqlens": cu.tolist(),
            "full_attention_rel_change": rel(full, feats),
        }

    def run_prompt(key, files, text):
        content = [{"type": "image"} for _ in files] + [{"type": "text", "text": text}]
        msgs = [{"role": "user", "content": content}]
        rendered = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ims = [Image.open(OUT / f) for f in files]
        inp = proc(text=rendered, images=ims, return_tensors="pt", add_special_tokens=False)
        ii = inp["input_ids"][0].tolist()
        n = len(ii)
        # What the bugs give (last position's logits): plain positions on all three axes (M-RoPE ignored);
        # every axis at the temporal row (the image flattened onto one position); full attention in every
        # vision layer (the windows ignored); a grey image. Generation continues at n + rope_deltas on all axes.
        with torch.no_grad():
            pos, deltas = model.model.get_rope_index(inp["input_ids"], inp["mm_token_type_ids"],
                                                     image_grid_thw=inp["image_grid_thw"],
                                                     attention_mask=inp["attention_mask"])
            model.model.rope_deltas = None
            out = model(**inp, use_cache=False).logits[0]
            plain = torch.arange(n).view(1, 1, n).expand(3, 1, n)
            no_mrope = model(**inp, position_ids=plain, use_cache=False).logits[0]
            t_only = model(**inp, position_ids=pos[:1].expand(3, 1, n), use_cache=False).logits[0]
            grey = dict(inp, pixel_values=torch.full_like(inp["pixel_values"], 0.25))
            no_image = model(**grey, use_cache=False).logits[0]
            model.model.rope_deltas = None
            gen = model.generate(**inp, do_sample=False, max_new_tokens=8)[0, n:]
            with full_attention():
                full = model(**inp, use_cache=False).logits[0]
                model.model.rope_deltas = None
                gen_full = model.generate(**inp, do_sample=False, max_new_tokens=8)[0, n:]
        meta["prompts"][key] = {
            "images": files, "text": text, "rendered": rendered,
            "expanded": tok.decode(ii), "input_ids": ii,
            "image_grid_thw": inp["image_grid_thw"].tolist(),
            "image_positions": [i for i, t in enumerate(ii) if t == ids["<|image_pad|>"]],
            "position_ids": pos[:, 0].tolist(), "rope_deltas": int(deltas.reshape(-1)[0]),
            "logits": f32(OUT / f"{key}.logits.bin", out.numpy()),
            "greedy": gen.tolist(), "greedy_text": tok.decode(gen),
            "greedy_full_attention": gen_full.tolist(),
            "full_attention_rel_change": rel(full[-1], out[-1]),
            "plain_positions_rel_change": rel(no_mrope[-1], out[-1]),
            "temporal_positions_only_rel_change": rel(t_only[-1], out[-1]),
            "grey_image_rel_change": rel(no_image[-1], out[-1]),
        }

    run_prompt("square", ["square.png"], "What is in this picture?")
    run_prompt("odd", ["odd.png"], "Describe it.")
    run_prompt("two", ["wide.png", "square.png"], "Compare them.")

    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    # The shared generator's wrapper: the tiny BPE tokenizer's pre-tokenizer is GPT-2's.
    conv = [sys.executable, str(Path(os.environ["SHARED_FIXTURES"]) / "convert_wrapper.py"), str(hf_dir),
            "--outtype", "f32"]
    subprocess.run(conv + ["--outfile", str(OUT / "model.gguf")], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=open(WORK / "convert.log", "w"))
    subprocess.run(conv + ["--mmproj", "--outfile", str(OUT / "mmproj-model.gguf")], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=open(WORK / "convert_mmproj.log", "w"))
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
    import gguf
    r = gguf.GGUFReader(OUT / "mmproj-model.gguf")
    meta["mmproj_tensors"] = {t.name: [int(x) for x in t.shape] + [t.tensor_type.name] for t in r.tensors}
    meta["mmproj_keys"] = {k: f.contents() for k, f in r.fields.items() if k.startswith("clip.")}
    r = gguf.GGUFReader(OUT / "model.gguf")
    arch = r.fields["general.architecture"].contents()
    meta["model_arch"] = arch
    meta["model_keys"] = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.")}
    for f in ("model.gguf", "mmproj-model.gguf"):
        meta[f"sha256_{f}"] = hashlib.sha256((OUT / f).read_bytes()).hexdigest()
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


if __name__ == "__main__":
    main()
