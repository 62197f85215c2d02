"""Ollama's model management through the official `ollama` client against one `frink serve`
started without -m (tests/serve_many.rs runs it): models load on first use, `ps` shows
them with expiry times, `keep_alive: 0` unloads, `create` gives a model whose answers
follow its system prompt and parameters, `copy` and `delete` work, path-like names are
refused. Prints "N checks passed".

Usage: python ollama_models_e2e.py http://127.0.0.1:PORT/v1
"""

import datetime
import sys

import ollama

BASE = sys.argv[1].removesuffix("/v1")
client = ollama.Client(host=BASE)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    checks += 1


def loaded():
    return sorted(m.model for m in client.ps().models)


def listed():
    return sorted(m.model for m in client.list().models)


GREEDY = {"temperature": 0, "num_predict": 12}
ASK = [{"role": "user", "content": "What is the sky?"}]

# Nothing is loaded before a request names a model.
check(loaded() == [], f"nothing loaded at start: {loaded()}")
check({"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"} <= set(listed()), f"the store is listed: {listed()}")

# Each model loads on first use.
small = client.chat(model="smollm2-135m", messages=ASK, options=GREEDY)
check(small.message.content and small.model == "smollm2-135m", f"smollm2 answers: {small}")
check(loaded() == ["smollm2-135m"], f"smollm2 loaded: {loaded()}")
check(small.load_duration > 0 and small.total_duration > small.load_duration, f"the load is counted: {small.load_duration}")
check(client.chat(model="smollm2-135m", messages=ASK, options=GREEDY).load_duration == 0, "loaded: no load time")
coder = client.chat(model="qwen2.5-coder-0.5b", messages=ASK, options=GREEDY)
check(coder.message.content and coder.message.content != small.message.content, "qwen answers")
emb = client.embed(model="gemma3-270m", input=["hello", "world"])
check(len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 640, "gemma3 embeds (640 values)")
check(loaded() == ["gemma3-270m", "qwen2.5-coder-0.5b", "smollm2-135m"], f"three loaded: {loaded()}")
now = datetime.datetime.now(datetime.timezone.utc)
for m in client.ps().models:
    left = (m.expires_at - now).total_seconds()
    check(200 < left <= 301, f"{m.model} expires in about 5 minutes (--keep-alive 5m): {left}")
    check(m.size > 0 and m.size_vram == 0 and m.details.family, f"{m.model}: size, no GPU memory, details")

# keep_alive on a request: 0 unloads once it ends; an empty request only unloads.
r = client.generate(model="gemma3-270m", keep_alive=0)
check(r.done_reason == "unload", f"an empty request with keep_alive 0 unloads: {r.done_reason}")
check("gemma3-270m" not in loaded(), f"gemma3 gone: {loaded()}")
again = client.chat(model="qwen2.5-coder-0.5b", messages=ASK, options=GREEDY, keep_alive=0)
check(again.message.content == coder.message.content, "the same greedy answer")
check(loaded() == ["smollm2-135m"], f"qwen unloaded after its request: {loaded()}")
r = client.generate(model="qwen2.5-coder-0.5b", keep_alive="1h")
check(r.done_reason == "load", f"an empty request loads: {r.done_reason}")
qwen = [m for m in client.ps().models if m.model == "qwen2.5-coder-0.5b"]
check(qwen and (qwen[0].expires_at - now).total_seconds() > 3000, "keep_alive 1h kept")
client.generate(model="qwen2.5-coder-0.5b", keep_alive=0)

# A created model: its system prompt and parameters apply to its requests.
SYSTEM = "You are a pirate. Answer in one short sentence."
r = client.create(model="pirate", from_="smollm2-135m", system=SYSTEM, parameters={"temperature": 0, "num_predict": 10})
check(r.status == "success", f"create: {r.status}")
check("pirate" in listed(), f"listed: {listed()}")
created = client.chat(model="pirate", messages=ASK, options={"seed": 7})
explicit = client.chat(
    model="smollm2-135m",
    messages=[{"role": "system", "content": SYSTEM}] + ASK,
    options={"temperature": 0, "num_predict": 10},
)
check(created.message.content == explicit.message.content, f"system and temperature followed: {created.message.content!r} vs {explicit.message.content!r}")
check(created.eval_count == 10, f"num_predict 10 followed: {created.eval_count}")
plain = client.chat(model="smollm2-135m", messages=ASK, options={"temperature": 0, "num_predict": 10})
check(plain.message.content != created.message.content, "the system prompt changes the answer")
other_seed = client.chat(model="pirate", messages=ASK, options={"seed": 8})
check(other_seed.message.content == created.message.content, "temperature 0: seeds do not matter")
own = client.chat(model="pirate", messages=ASK, options={"num_predict": 3})
check(own.eval_count == 3, "the request's own options win")
shown = client.show("pirate")
check(f"SYSTEM {SYSTEM!r}".replace("'", '"') in shown.modelfile and "temperature 0" in shown.parameters, f"show: {shown.modelfile!r} {shown.parameters!r}")
check(shown.details.parent_model == "smollm2-135m", f"parent: {shown.details.parent_model}")
check("FROM smollm2-135m" in shown.modelfile, shown.modelfile)

# copy and delete.
client.copy("pirate", "pirate-copy")
check({"pirate", "pirate-copy"} <= set(listed()), f"copied: {listed()}")
copied = client.chat(model="pirate-copy", messages=ASK)
check(copied.message.content == created.message.content, "the copy keeps the defaults")
client.delete("pirate")
check("pirate" not in listed() and "pirate-copy" in listed(), f"deleted: {listed()}")
client.delete("pirate-copy")
try:
    client.delete("pirate")
    check(False, "deleting twice fails")
except ollama.ResponseError as e:
    check(e.status_code == 404, f"404: {e}")

# Refusals by name.
for bad in ["../../etc/passwd", "/etc/passwd", "a/../../b"]:
    for call in (
        lambda: client.chat(model=bad, messages=ASK),
        lambda: client.delete(bad),
        lambda: client.show(bad),
        lambda: client.copy("smollm2-135m", bad),
        lambda: client.create(model=bad, from_="smollm2-135m"),
        lambda: client.create(model="x", from_=bad),
    ):
        try:
            call()
            check(False, f"{bad} accepted")
        except ollama.ResponseError as e:
            check(e.status_code == 400 and "path" in str(e), f"{bad}: {e}")
for field, value in [("template", "{{ .Prompt }}"), ("quantize", "q4_K_M"), ("files", {"a.gguf": "sha256:00"})]:
    try:
        client.create(model="x", from_="smollm2-135m", **{field: value})
        check(False, f"{field} accepted")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and field in str(e), f"{field}: {e}")
try:
    client.chat(model="no-such-model", messages=ASK)
    check(False, "an unknown model answered")
except ollama.ResponseError as e:
    check(e.status_code == 404 and "no-such-model" in str(e), f"404: {e}")
print(f"{checks} checks passed")
