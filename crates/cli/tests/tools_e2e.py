"""Tool calling through `frink serve` with the official `openai` Python package.

Run by crates/cli/tests/serve.rs (tool_calls_with_the_openai_client) with the server's
base URL and model name (qwen2.5-coder-0.5b, whose template teaches Hermes `<tool_call>`
calls). Checks: a two-turn tool loop (call, tool result, answer) streamed and not; streamed
deltas reassemble to the non-streamed `tool_calls`; `tool_choice: "required"` and a named
function give a valid call whose arguments validate against the tool's schema in every one
of 100 sampled runs; with `tool_choice: "auto"` every call that begins is valid (a lazy
grammar); ids are distinct. Exits non-zero on a failed check.
"""
import concurrent.futures
import json
import sys

import jsonschema
import openai
from e2e_checks import check, failures

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
USER = {"role": "user", "content": "What is the weather in Paris right now?"}


def valid_calls(calls, names):
    """Checks `calls`: distinct ids, names among `names`, arguments valid against the schema
    (`names` a dict of schemas, else those of SCHEMAS). Returns whether all hold."""
    before = len(failures)
    schemas = names if isinstance(names, dict) else SCHEMAS
    ids = [c.id for c in calls]
    check(len(set(ids)) == len(ids) and all(ids), f"ids {ids}")
    for c in calls:
        check(c.type == "function", f"type {c.type}")
        check(c.function.name in names, f"name {c.function.name}")
        try:
            jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
        except Exception as e:  # noqa: BLE001
            check(False, f"arguments {c.function.arguments!r}: {e.message if hasattr(e, 'message') else e}")
    return len(failures) == before


# Turn 1, required: a call.
r = client.chat.completions.create(model=model, messages=[USER], tools=[WEATHER, TIME],
                                   tool_choice="required", temperature=0, max_tokens=80)
choice = r.choices[0]
check(choice.finish_reason == "tool_calls", f"finish {choice.finish_reason}")
calls = choice.message.tool_calls or []
check(len(calls) >= 1, f"no call: {choice.message}")
valid_calls(calls, SCHEMAS)

# The same streamed: deltas reassemble to the same calls.
stream = client.chat.completions.create(model=model, messages=[USER], tools=[WEATHER, TIME],
                                        tool_choice="required", temperature=0, max_tokens=80,
                                        stream=True)
acc, finish = {}, None
for chunk in stream:
    for ch in chunk.choices:
        for d in ch.delta.tool_calls or []:
            e = acc.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                check(e["id"] is None, "id sent twice")
                e["id"] = d.id
            if d.function and d.function.name:
                e["name"] = d.function.name
            if d.function and d.function.arguments:
                e["arguments"] += d.function.arguments
        finish = ch.finish_reason or finish
streamed = [acc[k] for k in sorted(acc)]
check(finish == "tool_calls", f"stream finish {finish}")
# (Ids differ between the two responses; each streamed call sends its id once.)
check(all(c["id"] for c in streamed), f"streamed ids {streamed}")
check([(c["name"], c["arguments"]) for c in streamed] == [(c.function.name, c.function.arguments) for c in calls],
      f"streamed {streamed} vs {calls}")

# Turn 2: the tool's result goes back; the answer is text.
history = [USER, {"role": "assistant", "content": None, "tool_calls": [
    {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
    for c in calls]}]
for c in calls:
    history.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": 21, "sky": "clear"})})
for stream_it in (False, True):
    kw = dict(model=model, messages=history, tools=[WEATHER, TIME], tool_choice="none",
              temperature=0, max_tokens=60)
    if stream_it:
        text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **kw)
                       if ch.choices)
    else:
        r2 = client.chat.completions.create(**kw)
        text = r2.choices[0].message.content or ""
        check(not r2.choices[0].message.tool_calls, "tool_choice none gave a call")
    check(len(text.strip()) > 0, f"empty answer (stream={stream_it})")

# 100 sampled runs, required and named.
def one(seed):
    named = seed % 2 == 1
    tc = {"type": "function", "function": {"name": "get_time"}} if named else "required"
    r = client.chat.completions.create(model=model, messages=[USER], tools=[WEATHER, TIME], tool_choice=tc,
                                       temperature=0.9, seed=seed, max_tokens=100)
    return named, r.choices[0]

with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    runs = list(pool.map(one, range(100)))
ok = cut = 0
for named, ch in runs:
    calls = ch.message.tool_calls or []
    # A small model may repeat calls until max_tokens: that answer ends with "length" (as
    # llama-server reports it; the cut call stays in the content), its whole calls still read.
    check(ch.finish_reason in ("tool_calls", "length") and calls, f"run without a call: {ch.finish_reason} {ch.message}")
    valid_calls(calls, ["get_time"] if named else SCHEMAS)
    ok += bool(calls)
    cut += ch.finish_reason == "length"
print(f"required/named: {ok}/100 sampled runs called, {cut} of them cut by max_tokens")

# 40 sampled runs with tool_choice "auto": the answer is free, but a call once begun is
# held to the grammar, so every answer is either text without a call tag or valid calls.
# The tool's schema is one the model does not follow unaided (a city as a three-letter
# code, a required unit).
CODED = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}

def auto(seed):
    r = client.chat.completions.create(model=model, messages=[USER], tools=[CODED, TIME], tool_choice="auto",
                                       temperature=1.0, seed=seed, max_tokens=150)
    return r.choices[0]

with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    autos = list(pool.map(auto, range(1000, 1040)))
called = valid = 0
for ch in autos:
    calls = ch.message.tool_calls or []
    if calls:
        called += 1
        check(ch.finish_reason in ("tool_calls", "length"), f"auto: calls with finish {ch.finish_reason}")
        valid += valid_calls(calls, {"get_weather": CODED["function"]["parameters"], "get_time": SCHEMAS["get_time"]})
    elif ch.finish_reason != "length":
        check("<tool_call>" not in (ch.message.content or ""), f"auto: a call left in the content: {ch.message}")
check(called > 0, "auto: no run called a tool")
print(f"auto: {called}/40 sampled runs called a tool, {valid} of them with valid calls")

# A budget that cuts the answer inside a call never leaves call markup in the content
# (before, a cut second call left '<tool_call>\n{\n  "name": "' there), whole or streamed.
two_cities = {"role": "user", "content": "What is the weather in Paris and in Tokyo right now?"}
for n in range(4, 64, 6):
    for stream_it in (False, True):
        kw = dict(model=model, messages=[two_cities], tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=n)
        if stream_it:
            text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **kw) if ch.choices)
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content or ""
        check("<tool_call" not in text and '"name"' not in text, f"max_tokens {n} (stream={stream_it}): markup in the content: {text!r}")

# A JSON schema beside tools under tool_choice "auto": the model may call a tool (before,
# the schema governed the whole answer and no call could be made) or answer in the schema.
person = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
r = client.chat.completions.create(model=model, messages=[USER], tools=[WEATHER], tool_choice="auto", temperature=0,
                                   max_tokens=96, response_format=rf)
calls = r.choices[0].message.tool_calls or []
check(len(calls) == 1 and calls[0].function.name == "get_weather", f"schema + auto tools: no call: {r.choices[0].message}")
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
                                   tools=[WEATHER], tool_choice="auto", temperature=0, max_tokens=96, response_format=rf)
m = r.choices[0].message
check(bool(m.tool_calls) or (r.choices[0].finish_reason == "stop" and jsonschema.validate(json.loads(m.content), person) is None),
      f"schema + auto tools: neither a call nor the schema: {m}")
try:
    client.chat.completions.create(model=model, messages=[USER], tools=[WEATHER], tool_choice="auto", max_tokens=4,
                                   extra_body={"grammar": 'root ::= "yes"'})
    check(False, "a grammar beside auto tools was accepted")
except openai.BadRequestError as e:
    check(e.body.get("param") == "grammar", f"grammar + auto tools: {e.body}")

# Refusals: an unknown named function, tool_choice without tools.
for kw, param in [({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                  ({"tools": [{"type": "function"}]}, "tools")]:
    try:
        client.chat.completions.create(model=model, messages=[USER], max_tokens=4, **kw)
        check(False, f"{kw} accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == param, f"{kw}: param {e.body.get('param')}")

print(f"{ok}/100 sampled required/named runs gave valid calls; {len(failures)} failures")
if failures:
    sys.exit(1)
print("tool checks passed")
