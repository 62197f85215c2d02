"""Images through `frink serve` with the official `openai` and `ollama` Python clients.

Run by crates/cli/tests/images.rs (vision_python_clients_end_to_end) with the server's base
URL and the tiny Qwen2.5-VL fixture's folder (crates/vision/tests/data/qwen25vl), served
with its projector file and `--image-max-pixels 10000`. The reference is llama.cpp's
`/completion` with `multimodal_data` (its tokens are the fixture's transformers tokens).
Checks: an image as a data URI (openai) and as base64 (ollama) give the reference's text;
a second turn about the image reuses its cached rows (`cached_tokens`); two images in one
message give the reference's text; an image past `--image-max-pixels` and a URL without
`--allow-image-urls` are 400s naming what is wrong. With `--text-only` (a server of the
same model without its projector file): images are refused naming the model. Exits
non-zero on a failed check.
"""
import base64
import json
import pathlib
import struct
import sys
import urllib.request
import zlib

import ollama
import openai
from e2e_checks import check, failures

base_url = sys.argv[1].removesuffix("/v1")
fixture = pathlib.Path(sys.argv[2])
text_only = "--text-only" in sys.argv[3:]
oa = openai.OpenAI(base_url=base_url + "/v1", api_key="none", timeout=300)
ol = ollama.Client(host=base_url, timeout=300)
meta = json.loads((fixture / "meta.json").read_text())
model = oa.models.list().data[0].id
MARKER = "<|vision_start|><|image_pad|><|vision_end|>"


def post(path, body):
    req = urllib.request.Request(base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def b64(name):
    return base64.b64encode((fixture / name).read_bytes()).decode()


def png(w, h):
    """An RGB PNG of w × h grey pixels (no imaging library in the clients' environment)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * (3 * w) for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def image_part(data_b64):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data_b64}}


def user(files, text):
    return {"role": "user", "content": [image_part(b64(f)) for f in files] + [{"type": "text", "text": text}]}


def reference(key):
    """llama.cpp's /completion on the processor's text with the prompt's images."""
    p = meta["prompts"][key]
    prompt = p["rendered"].replace(MARKER, "<__media__>")
    r = post("/completion", {"prompt": {"prompt_string": prompt, "multimodal_data": [b64(f) for f in p["images"]]},
                             "temperature": 0, "n_predict": 8, "return_tokens": True})
    check(r["tokens"] == p["greedy_full_attention"], f"{key}: /completion tokens {r['tokens']}")
    return r["content"]


def refused(call, words, what):
    """`call` raises a 400 whose message holds each of `words`."""
    try:
        call()
    except (openai.BadRequestError, ollama.ResponseError) as e:
        msg = str(e)
        status = getattr(e, "status_code", None)
        check(status == 400, f"{what}: status {status}")
        check(all(w in msg for w in words), f"{what}: message {msg!r} lacks {words}")
        return
    check(False, f"{what}: accepted")


if text_only:
    refused(lambda: oa.chat.completions.create(model=model, messages=[user(["square.png"], "Hi")], max_tokens=2),
            ["image", model], "openai, no projector")
    refused(lambda: ol.chat(model=model, messages=[{"role": "user", "content": "Hi",
                                                        "images": [(fixture / "square.png").read_bytes()]}]),
            ["image", model], "ollama, no projector")
else:
    GREEDY = {"temperature": 0, "max_tokens": 8}
    text = meta["prompts"]["square"]["text"]
    want = reference("square")
    # A data URI through openai, base64 through ollama (the client encodes the bytes).
    r = oa.chat.completions.create(model=model, messages=[user(["square.png"], text)], **GREEDY)
    check(r.choices[0].message.content == want, f"openai {r.choices[0].message.content!r} != {want!r}")
    check(r.usage.prompt_tokens == len(meta["prompts"]["square"]["input_ids"]), f"prompt tokens {r.usage.prompt_tokens}")
    o = ol.chat(model=model, messages=[{"role": "user", "content": text,
                                             "images": [(fixture / "square.png").read_bytes()]}],
                options={"temperature": 0, "num_predict": 8})
    check(o.message.content == want, f"ollama {o.message.content!r} != {want!r}")
    # A second turn about the same image reuses its rows (36 rows from position 37).
    turn2 = [user(["square.png"], text), {"role": "assistant", "content": want},
             {"role": "user", "content": "And the colours?"}]
    r2 = oa.chat.completions.create(model=model, messages=turn2, **GREEDY)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check(cached is not None and cached >= 73, f"second turn cached {cached}")
    # Two images in one message.
    two = meta["prompts"]["two"]
    r3 = oa.chat.completions.create(model=model, messages=[user(two["images"], two["text"])], **GREEDY)
    want2 = reference("two")
    check(r3.choices[0].message.content == want2, f"two images {r3.choices[0].message.content!r} != {want2!r}")
    # Refusals: past --image-max-pixels (10000), a URL without --allow-image-urls.
    big = base64.b64encode(png(120, 100)).decode()
    refused(lambda: oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": [image_part(big), {"type": "text", "text": "Hi"}]}],
        max_tokens=2), ["120×100", "--image-max-pixels"], "openai, oversized image")
    refused(lambda: ol.chat(model=model, messages=[{"role": "user", "content": "Hi", "images": [png(120, 100)]}]),
            ["120×100", "--image-max-pixels"], "ollama, oversized image")
    refused(lambda: oa.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}},
                                               {"type": "text", "text": "Hi"}]}],
        max_tokens=2), ["--allow-image-urls"], "openai, URL")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("vision checks passed")
