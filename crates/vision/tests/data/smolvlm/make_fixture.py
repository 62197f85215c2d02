#!/usr/bin/env python3
"""Tiny random-weight SmolVLM (Idefics3) vision-language fixture, transformers (fp32) as the reference.

Extends the project's fixture generator (shared/tools/fixtures/gen_fixtures.py: its tiny byte-level BPE
tokenizer and its perturbation of constant parameters) to Idefics3ForConditionalGeneration (SmolVLM's
class: a SigLIP tower, pixel shuffle, a linear projection, a Llama language model), converted with
llama.cpp's convert_hf_to_gguf.py twice: the language model (model.gguf) and the projector (--mmproj:
mmproj-model.gguf). The processor splits an image into tiles of the encoder's size plus a global view,
as SmolVLM's does, at a tiny scale (longest edge 64, tiles of 32).

Run (see README.md beside this file):
  LLAMA_CPP_DIR=<llama.cpp source tree> SHARED_FIXTURES=<shared/tools/fixtures> \
    <python with torch, transformers 5.24, pillow, tokenizers, safetensors> make_fixture.py
"""
from __future__ import annotations

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

WORK = G.WORK / "smolvlm_vision"
SEED = 5151
IMAGE_SIZE, PATCH, SCALE = 32, 4, 2
SEQ = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2  # rows per tile: 16
LONGEST = 64  # the processor's size.longest_edge: up to 2 × 2 tiles
SPECIAL = (["<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
           + [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)])
# SmolVLM-Instruct's chat template (HuggingFaceTB/SmolVLM-Instruct), as published.
TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def f32(path: Path, a) -> list:
    a = np.asarray(a, dtype="<f4")
    a.tofile(path)
    return list(a.shape)


def test_images():
    """Sizes that give every layout: 2 × 2 tiles, 1 × 2 (wide), 2 × 1 (tall), one tile only."""
    rng = np.random.default_rng(SEED)

    def save(name, h, w, f):
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack(f(x, y), -1) + rng.integers(0, 40, (h, w, 3))
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB").save(OUT / name)

    save("square.png", 48, 48, lambda x, y: [x * 5, y * 5, (x + y) * 3])
    save("wide.png", 21, 70, lambda x, y: [255 - x * 3, y * 10, (x * y) % 256])
    save("tall.png", 50, 23, lambda x, y: [(x * 7) % 256, 255 - y * 4, x + y])
    return ["square.png", "wide.png", "tall.png"]


def build_tokenizer(hf_dir: Path):
    from transformers import AutoTokenizer
    src = G.build_bpe(320)
    tok = AutoTokenizer.from_pretrained(src)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(hf_dir)
    return tok, {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}


def main():
    from transformers import AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    import transformers

    shutil.rmtree(WORK, ignore_errors=True)
    hf_dir = WORK / "hf"
    hf_dir.mkdir(parents=True)
    tok, ids = build_tokenizer(hf_dir)
    vocab = len(tok)
    text_cfg = dict(
        model_type="llama", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        initializer_range=0.15, max_position_embeddings=4096)
    vision_cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=IMAGE_SIZE, patch_size=PATCH, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                      num_channels=3, model_type="idefics3_vision")
    cfg = Idefics3Config(text_config=text_cfg, vision_config=vision_cfg, scale_factor=SCALE,
                         image_token_id=ids["<image>"], tie_word_embeddings=False, initializer_range=0.15)
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(cfg).eval()
    touched = G.perturb_constant_params(model, 0.1, torch.Generator().manual_seed(SEED + 17))
    with torch.no_grad():  # the tower's default init is small: widen so every part matters
        for n, p in model.named_parameters():
            if ("vision_model" in n or "connector" in n) and p.dim() >= 2:
                p.normal_(0, 0.15, generator=torch.Generator().manual_seed(SEED + zlib.crc32(n.encode()) % 1000))
    model.save_pretrained(hf_dir)
    # Published SmolVLM checkpoints name their language model's class in text_config (SmolVLM2:
    # VLlama3ForCausalLM), which is what the converter reads for the text GGUF.
    cj = json.loads((hf_dir / "config.json").read_text())
    cj["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
    (hf_dir / "config.json").write_text(json.dumps(cj, indent=2))
    improc = Idefics3ImageProcessorPil(size={"longest_edge": LONGEST}, max_image_size={"longest_edge": IMAGE_SIZE})
    proc = Idefics3Processor(image_processor=improc, tokenizer=tok, image_seq_len=SEQ, chat_template=TEMPLATE)
    proc.save_pretrained(hf_dir)
    tok = proc.tokenizer

    model = Idefics3ForConditionalGeneration.from_pretrained(hf_dir, attn_implementation="eager",
                                                             dtype=torch.float32).eval()
    names = test_images()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": SEED,
            "image_processor": type(improc).__name__, "special_token_ids": ids, "vocab_size": vocab,
            "text_config": text_cfg, "vision_config": vision_cfg, "scale_factor": SCALE, "image_seq_len": SEQ,
            "size_longest_edge": LONGEST, "perturbed": touched, "images": {}, "prompts": {}}
    for n in names:
        im = Image.open(OUT / n)
        out = improc(images=im, return_tensors="pt", return_row_col_info=True)
        px = out["pixel_values"][0]  # [frames][3][32][32]: the tiles row by row, then the global view
        stem = n.split(".")[0]
        rec = {"pixels": f32(OUT / f"{stem}.pixels.bin", px.numpy()),
               "rows": int(out["rows"][0][0]), "cols": int(out["cols"][0][0])}
        with torch.no_grad():
            feats = model.model.get_image_features(pixel_values=px[None])
            feats = feats.pooler_output[0]  # [frames × 16][64], in the frames' order
        rec["embeds"] = f32(OUT / f"{stem}.embeds.bin", feats.reshape(-1, 64).numpy())
        meta["images"][n] = rec

    def run_prompt(key, files, text):
        content = [{"type": "image"} for _ in files] + [{"type": "text", "text": text}]
        msgs = [{"role": "user", "content": content}]
        rendered = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ims = [Image.open(OUT / f) for f in files]
        inp = proc(text=rendered, images=ims, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model(**inp, use_cache=False).logits[0]
            no_image = model(input_ids=inp["input_ids"], pixel_values=torch.full_like(inp["pixel_values"], 0.25),
                             pixel_attention_mask=inp["pixel_attention_mask"], use_cache=False).logits[0]
            gen = model.generate(**inp, do_sample=False, max_new_tokens=8)[0, inp["input_ids"].shape[1]:]
        rel = lambda a, b: float(torch.linalg.norm(a[-1] - b[-1]) / torch.linalg.norm(b[-1]))  # noqa: E731
        ii = inp["input_ids"][0].tolist()
        meta["prompts"][key] = {
            "images": files, "text": text, "rendered": rendered,
            "expanded": tok.decode(ii), "input_ids": ii,
            "image_positions": [i for i, t in enumerate(ii) if t == ids["<image>"]],
            "logits": f32(OUT / f"{key}.logits.bin", out.numpy()),
            "greedy": gen.tolist(),
            "grey_image_rel_change": rel(no_image, out),
        }

    run_prompt("square", ["square.png"], "What is in this picture?")
    run_prompt("wide", ["wide.png"], "Describe it.")
    run_prompt("two", ["tall.png", "square.png"], "Compare them.")

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
    meta["mmproj_keys"] = {k: (f.contents() if not k.startswith("GGUF.") else None) for k, f in r.fields.items()
                           if k.startswith("clip.")}
    for f in ("model.gguf", "mmproj-model.gguf"):
        meta[f"sha256_{f}"] = hashlib.sha256((OUT / f).read_bytes()).hexdigest()
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


if __name__ == "__main__":
    main()
