"""Ollama's API through `frink serve` with the official `ollama` Python client.

Run by crates/cli/tests/serve.rs (ollama_python_client_end_to_end) with the server's base
URL and model name (qwen2.5-coder-0.5b, whose template teaches tool calls). Checks: chat
streamed and not (the greedy answer equal to /v1/chat/completions'), generate, list, show,
ps, embed and embeddings (equal to /v1/embeddings, normalised and raw), pull of a catalog
name, format with a schema, a tool call with object arguments, images refused. Exits
non-zero on a failed check.
"""
import json
import math
import sys
import urllib.request

import jsonschema
import ollama
from e2e_checks import check, failures

base_url, model = sys.argv[1].removesuffix("/v1"), sys.argv[2]
client = ollama.Client(host=base_url, timeout=300)


def post(path, body):
    req = urllib.request.Request(base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


MESSAGES = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "num_predict": 24}

# chat, whole and streamed; the same answer as the OpenAI endpoint.
r = client.chat(model=model, messages=MESSAGES, options=GREEDY)
check(r.done and r.done_reason in ("stop", "length"), f"chat done {r.done} {r.done_reason}")
check(0 < r.eval_count <= 24 and r.prompt_eval_count > 0, f"counts {r.eval_count} {r.prompt_eval_count}")
short = client.chat(model=model, messages=MESSAGES, options={"temperature": 0, "num_predict": 3})
check(short.done_reason == "length" and short.eval_count == 3, f"num_predict 3: {short.done_reason} {short.eval_count}")
check(all(isinstance(x, int) and x >= 0 for x in (r.total_duration, r.prompt_eval_duration, r.eval_duration)),
      "durations")
oa = post("/v1/chat/completions", {"messages": MESSAGES, "temperature": 0, "max_tokens": 24})
check(r.message.content == oa["choices"][0]["message"]["content"],
      f"chat {r.message.content!r} != openai {oa['choices'][0]['message']['content']!r}")
parts = list(client.chat(model=model, messages=MESSAGES, options=GREEDY, stream=True))
check(parts[-1].done and not any(p.done for p in parts[:-1]), "stream: done only on the last line")
check("".join(p.message.content or "" for p in parts) == r.message.content, "stream != whole")

# generate.
g = client.generate(model=model, prompt="Name three colours.", options=GREEDY)
check(g.response == r.message.content, f"generate {g.response!r} != chat {r.message.content!r}")
check(not g.context, "generate returns no context (frink does not take it back)")
gs = "".join(p.response for p in client.generate(model=model, prompt="Name three colours.", options=GREEDY, stream=True))
check(gs == g.response, "generate stream != whole")
raw = client.generate(model=model, prompt="def fib(n):", raw=True, options=GREEDY)
check(len(raw.response) > 0, "raw generate")

# Log-probabilities (Ollama's logprobs and top_logprobs): one per generated token, greedy
# tokens the most likely, spelling the answer; the stream's lines carry the same.
lp = client.chat(model=model, messages=MESSAGES, options=GREEDY, logprobs=True, top_logprobs=3)
# (The end-of-turn token that ended the answer is counted in eval_count, but has no text.)
check(lp.logprobs is not None and len(lp.logprobs) == lp.eval_count - (lp.done_reason == "stop"), f"chat logprobs: {lp.logprobs and len(lp.logprobs)} vs {lp.eval_count}")
check(all(len(t.top_logprobs) == 3 and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6 for t in lp.logprobs),
      "greedy: each token is its top alternative")
check("".join(t.token for t in lp.logprobs).startswith(lp.message.content), "the tokens spell the answer")
streamed = [t for p in client.chat(model=model, messages=MESSAGES, options=GREEDY, logprobs=True, stream=True) for t in (p.logprobs or [])]
check([t.token for t in streamed] == [t.token for t in lp.logprobs], "streamed logprobs != whole")
glp = client.generate(model=model, prompt="def fib(n):", raw=True, options=GREEDY, logprobs=True, top_logprobs=2)
check(len(glp.logprobs) == glp.eval_count - (glp.done_reason == "stop") and len(glp.logprobs[0].top_logprobs) == 2, f"generate logprobs {glp.logprobs[:1]}")

# list, show, ps.
models = client.list().models
check(models[0].model == model and models[0].details.format == "gguf", f"list: the -m model first {models}")
s = client.show(model)
check("completion" in s.capabilities and "tools" in s.capabilities, f"capabilities {s.capabilities}")
check(s.modelinfo.get("general.architecture") == "qwen2", "model_info")
check(s.details.quantization_level == "Q4_K_M", f"quantization {s.details.quantization_level}")
check([m.model for m in client.ps().models] == [model], "ps: the -m model alone is loaded")

# embed (normalised) and embeddings (raw) against /v1/embeddings.
e = client.embed(model=model, input=["red", "a green apple"])
check(len(e.embeddings) == 2, "embed count")
v1 = post("/v1/embeddings", {"input": ["red", "a green apple"]})["data"]
check(all(abs(a - b) < 1e-6 for a, b in zip(e.embeddings[1], v1[1]["embedding"])), "embed != /v1/embeddings")
rawv = client.embeddings(model=model, prompt="red").embedding
n = math.sqrt(sum(x * x for x in rawv))
check(abs(n - 1) > 1e-3, "legacy embeddings are not normalised")
check(all(abs(a / n - b) < 1e-5 for a, b in zip(rawv, e.embeddings[0])), "embeddings / norm != embed")

# pull of a catalog name (already present: success at once).
check(client.pull("smollm2-135m").status == "success", "pull")
statuses = [p.status for p in client.pull("smollm2-135m", stream=True)]
check(statuses and statuses[-1] == "success", f"pull stream {statuses}")
try:
    client.pull("no-such-model")
    check(False, "pull of an unknown name succeeded")
except ollama.ResponseError as err:
    check("no-such-model" in str(err), f"pull error {err}")

# format with a JSON schema.
schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20},
                                            "rgb": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["colour", "rgb"]}
f = client.chat(model=model, messages=[{"role": "user", "content": "A colour as JSON."}], format=schema,
                options={"temperature": 0, "num_predict": 80})
try:
    jsonschema.validate(json.loads(f.message.content), schema)
except Exception as err:  # noqa: BLE001
    check(False, f"format: {f.message.content!r}: {err}")

# A tool call: arguments come back as an object.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}
t = client.chat(model=model, messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
                tools=[WEATHER], options={"temperature": 0, "num_predict": 100})
calls = t.message.tool_calls or []
check(len(calls) >= 1 and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments, dict)
      and isinstance(calls[0].function.arguments.get("city"), str), f"tool call {t.message}")
if calls:
    # The tool's result goes back with the call in the history; the answer is text.
    history = [{"role": "user", "content": "What is the weather in Paris right now?"}, t.message,
               {"role": "tool", "content": "21 degrees, clear", "tool_name": "get_weather"}]
    t2 = client.chat(model=model, messages=history, options={"temperature": 0, "num_predict": 40})
    check(len(t2.message.content or "") > 0, f"answer after the tool result {t2.message}")

# images are refused with an error in Ollama's shape.
try:
    client.chat(model=model, messages=[{"role": "user", "content": "What is this?", "images": [b"\x89PNG"]}])
    check(False, "images accepted")
except ollama.ResponseError as err:
    check(err.status_code == 400 and "images" in err.error, f"images error {err.status_code} {err.error}")

print(f"{len(failures)} failures")
if failures:
    sys.exit(1)
print("ollama checks passed")
