#!/usr/bin/env python3
"""Tiny random-weight Gemma 3 vision-language fixture with transformers (fp32) as the reference.

Extends the project's fixture generator (shared/tools/fixtures/gen_fixtures.py: its tiny
SentencePiece tokenizer and its perturbation of constant parameters) to
Gemma3ForConditionalGeneration, converted with llama.cpp's convert_hf_to_gguf.py twice: the
language model (model.gguf) and the projector (--mmproj: mmproj-model.gguf).

Run (see README.md beside this file):
  LLAMA_CPP_DIR=<llama.cpp source tree> SHARED_FIXTURES=<shared/tools/fixtures> \
    <python with torch, transformers 5.24, pillow, sentencepiece> make_fixture.py
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

WORK = G.WORK / "gemma3_vision"
SEED = 4242
SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
N_SPM = 384
IMAGE_SIZE, PATCH, MM_TOKENS = 32, 4, 16
# Gemma 3's chat template (google/gemma-3-4b-it), as published.
TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)


def f32(path: Path, a) -> list:
    a = np.asarray(a, dtype="<f4")
    a.tofile(path)
    return list(a.shape)


def test_images():
    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:32, 0:32]
    native = np.stack([x * 8, y * 8, (x + y) * 4], -1) + rng.integers(0, 40, (32, 32, 3))
    Image.fromarray(np.clip(native, 0, 255).astype(np.uint8), "RGB").save(OUT / "native.png")
    y, x = np.mgrid[0:29, 0:45]
    odd = np.stack([255 - x * 5, y * 8, (x * y) % 256], -1) + rng.integers(0, 30, (29, 45, 3))
    Image.fromarray(np.clip(odd, 0, 255).astype(np.uint8), "RGB").save(OUT / "odd.png")
    rgba = rng.integers(0, 256, (40, 20, 4)).astype(np.uint8)
    Image.fromarray(rgba, "RGBA").save(OUT / "rgba.png")
    y, x = np.mgrid[0:40, 0:40]
    photo = np.stack([x * 6, 255 - y * 6, (x * 3 + y * 3) % 256], -1)
    Image.fromarray(photo.astype(np.uint8), "RGB").save(OUT / "photo.jpg", quality=90)
    return ["native.png", "odd.png", "rgba.png", "photo.jpg"]


def build_tokenizer(hf_dir: Path):
    from transformers import AutoTokenizer
    src = G.build_spm(N_SPM)
    tmp = WORK / "tok_src"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "tokenizer.model", tmp / "tokenizer.model")
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": None, "add_bos_token": True, "model_max_length": 4096,
    }))
    tok = AutoTokenizer.from_pretrained(tmp)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.boi_token, tok.eoi_token, tok.image_token = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
    tok.chat_template = TEMPLATE
    tok.save_pretrained(hf_dir)
    # The processor reads these names from the tokenizer's config.
    tc = json.loads((hf_dir / "tokenizer_config.json").read_text())
    tc["extra_special_tokens"] = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                  "image_token": "<image_soft_token>"}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
    shutil.copy(src / "tokenizer.model", hf_dir / "tokenizer.model")
    # The converter reads the added tokens (GemmaTokenizer's <mask> first) from here.
    added = {t: i for t, i in tok.get_added_vocab().items() if i >= N_SPM}
    (hf_dir / "added_tokens.json").write_text(json.dumps(added))
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}


def main():
    from transformers import (AutoProcessor, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor,
                              AutoTokenizer)
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    import transformers

    shutil.rmtree(WORK, ignore_errors=True)
    hf_dir = WORK / "hf"
    hf_dir.mkdir(parents=True)
    ids = build_tokenizer(hf_dir)
    vocab = max(ids.values()) + 1
    text_cfg = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=16, sliding_window=16, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}},
        final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True, pad_token_id=0,
        initializer_range=0.15, max_position_embeddings=4096)
    vision_cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=IMAGE_SIZE, patch_size=PATCH, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                      num_channels=3, model_type="siglip_vision_model")
    cfg = Gemma3Config(text_config=text_cfg, vision_config=vision_cfg, mm_tokens_per_image=MM_TOKENS,
                       boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                       image_token_index=ids["<image_soft_token>"], initializer_range=0.15,
                       tie_word_embeddings=True)
    torch.manual_seed(SEED)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    touched = G.perturb_constant_params(model, 0.1, torch.Generator().manual_seed(SEED + 17))
    with torch.no_grad():  # SigLIP's default init is small: widen so every part matters
        for n, p in model.named_parameters():
            if "vision_tower" in n and p.dim() >= 2:
                p.normal_(0, 0.15, generator=torch.Generator().manual_seed(SEED + zlib.crc32(n.encode()) % 1000))
        # The converter stores the projection in F16 (its tensor_force_quant): the reference
        # holds the same values, so the files and the reference agree to f32 rounding.
        w = model.model.multi_modal_projector.mm_input_projection_weight
        w.copy_(w.half().float())
    model.save_pretrained(hf_dir)
    improc = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False,
                                     image_mean=[0.5] * 3, image_std=[0.5] * 3)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    proc = Gemma3Processor(image_processor=improc, tokenizer=tok, chat_template=TEMPLATE,
                           image_seq_length=MM_TOKENS)
    proc.save_pretrained(hf_dir)
    pc = hf_dir / "preprocessor_config.json"
    pj = json.loads(pc.read_text()) if pc.exists() else {}
    pj["image_seq_length"] = MM_TOKENS  # the mmproj converter reads it (scale factor)
    pc.write_text(json.dumps(pj, indent=1))

    model = Gemma3ForConditionalGeneration.from_pretrained(hf_dir, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    names = test_images()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": SEED,
            "image_processor": type(improc).__name__, "special_token_ids": ids, "vocab_size": vocab,
            "text_config": text_cfg, "vision_config": vision_cfg, "mm_tokens_per_image": MM_TOKENS,
            "perturbed": touched, "images": {}, "prompts": {}}
    for n in names:
        im = Image.open(OUT / n)
        px = improc(images=im, return_tensors="pt")["pixel_values"]
        stem = n.split(".")[0]
        rec = {"pixels": f32(OUT / f"{stem}.pixels.bin", px[0].numpy())}
        with torch.no_grad():
            feats = model.model.get_image_features(pixel_values=px)
            feats = getattr(feats, "pooler_output", feats)
        rec["embeds"] = f32(OUT / f"{stem}.embeds.bin", feats.reshape(-1, 64).numpy())
        if n.endswith(".jpg"):
            rgb = np.asarray(im.convert("RGB"))
            (OUT / f"{stem}.rgb").write_bytes(rgb.tobytes())
            rec["rgb"] = list(rgb.shape)
        meta["images"][n] = rec

    def run_prompt(key, files, text):
        content = [{"type": "image"} for _ in files] + [{"type": "text", "text": text}]
        msgs = [{"role": "user", "content": content}]
        rendered = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ims = [Image.open(OUT / f) for f in files]
        # The template writes the BOS itself (as the model's own rule adds it once).
        inp = proc(text=rendered, images=ims, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model(**inp, use_cache=False).logits[0]
            causal = model(input_ids=inp["input_ids"], pixel_values=inp["pixel_values"],
                           use_cache=False).logits[0]
            no_image = model(input_ids=inp["input_ids"], pixel_values=inp["pixel_values"] * 0 - 0.0,
                             token_type_ids=inp["token_type_ids"], use_cache=False).logits[0]
            gen = model.generate(**inp, do_sample=False, max_new_tokens=8)[0, inp["input_ids"].shape[1]:]
        rel = lambda a, b: float(torch.linalg.norm(a[-1] - b[-1]) / torch.linalg.norm(b[-1]))  # noqa: E731
        ii = inp["input_ids"][0].tolist()
        meta["prompts"][key] = {
            "images": files, "text": text, "rendered": rendered,
            "expanded": tok.decode(ii), "input_ids": ii,
            "token_type_ids": inp["token_type_ids"][0].tolist(),
            "image_positions": [i for i, t in enumerate(ii) if t == ids["<image_soft_token>"]],
            "logits": f32(OUT / f"{key}.logits.bin", out.numpy()),
            "greedy": gen.tolist(),
            "causal_rel_change": rel(causal, out),
            "black_image_rel_change": rel(no_image, out),
        }

    run_prompt("native", ["native.png"], "What is in this picture?")
    run_prompt("odd", ["odd.png"], "Describe it.")
    run_prompt("two", ["native.png", "odd.png"], "Compare them.")

    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    conv = [sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f32"]
    subprocess.run(conv + ["--outfile", str(OUT / "model.gguf")], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=open(WORK / "convert.log", "w"))
    # transformers 5 saves the tower as `vision_tower.*`; the converter's names are the
    # published checkpoints' `vision_tower.vision_model.*`: a renamed copy for the projector.
    from safetensors.torch import load_file, save_file
    mm_dir = WORK / "hf_mmproj"
    shutil.copytree(hf_dir, mm_dir)
    sd = load_file(hf_dir / "model.safetensors")
    sd = {(k.replace("vision_tower.", "vision_tower.vision_model.", 1)
           if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.") else k): v
          for k, v in sd.items()}
    save_file(sd, mm_dir / "model.safetensors", metadata={"format": "pt"})
    conv[2] = str(mm_dir)
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
