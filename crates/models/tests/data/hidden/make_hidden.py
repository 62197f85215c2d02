"""Transformers' hidden states for tiny fixtures: the reference of frink's named intermediates.

For each fixture directory (shared/fixtures/tiny/<name>), the model is rebuilt in transformers from
its own model.gguf (transformers' GGUF loader, which undoes the converter's permutations) with the
fixture's hf_config.json, checked against the fixture's recorded transformers logits (logits_hf.bin:
the rebuilt model must give them, or nothing is written), and run in fp32 on the fixture's input_ids
with output_hidden_states. Written: <out>/<name>.bin, little-endian f32 [n_layers][n_tokens][n_embd],
row i the output of layer i (transformers' hidden_states[i + 1]; the last layer's is taken before the
final norm, from a hook on the last decoder layer), and <out>/<name>.json (shape, the logits check).

    V=venv-with-torch-transformers-gguf   # torch 2.15, transformers 5.24, gguf
    $V/bin/python make_hidden.py ../../../../../shared/fixtures/tiny llama gemma3 --out .
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path, help="the tiny fixtures' folder")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.names:
        d = args.root / name
        meta = json.loads((d / "meta.json").read_text())
        config = transformers.AutoConfig.from_pretrained(d / "hf_config.json")
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, gguf_file="model.gguf", config=config, torch_dtype=torch.float32
        ).eval()
        ids = torch.tensor([meta["input_ids"]])
        layers = model.model.layers
        last = {}
        layers[-1].register_forward_hook(
            lambda _m, _i, out: last.__setitem__("h", out[0] if isinstance(out, tuple) else out)
        )
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        logits = out.logits[0].numpy()
        ref = np.fromfile(d / "logits_hf.bin", dtype="<f4").reshape(logits.shape)
        err = float(np.abs(logits - ref).max() / np.abs(ref).max())
        if not err < 1e-5:
            sys.exit(f"{name}: the model rebuilt from model.gguf gives other logits ({err:.3g})")
        hs = [h[0].numpy() for h in out.hidden_states[1:-1]] + [last["h"][0].numpy()]
        arr = np.stack(hs).astype("<f4")
        assert arr.shape[0] == len(layers), (arr.shape, len(layers))
        arr.tofile(args.out / f"{name}.bin")
        (args.out / f"{name}.json").write_text(json.dumps({
            "fixture": name,
            "shape": list(arr.shape),
            "layout": "f32 [n_layers][n_tokens][n_embd]: row i is layer i's output (l_out)",
            "logits_vs_fixture": err,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }, indent=1) + "\n")
        print(f"{name}: {arr.shape}, logits against the fixture's {err:.3g}")


if __name__ == "__main__":
    main()
