"""End-to-end check of `frink serve`'s Messages API with the official `anthropic` package.

Run by crates/cli/tests/serve_answers.rs (anthropic_python_client_end_to_end) with the
server's base URL (ending in /v1) and the model name; the server runs qwen2.5-coder-0.5b,
whose template teaches Hermes tool calls. Exits non-zero on the first failed check.
"""

import json
import sys

import anthropic
import httpx
import jsonschema

base_url, model = sys.argv[1], sys.argv[2]
root = base_url.removesuffix("/v1")
client = anthropic.Anthropic(base_url=root, api_key="sekrit", max_retries=0, timeout=120)
greedy = {"temperature": 0}
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


system = "You are a concise assistant."
question = [{"role": "user", "content": "Name three primary colors."}]

# A plain message with a system prompt.
m = client.messages.create(model=model, max_tokens=48, system=system, messages=question, extra_body=greedy)
text = "".join(b.text for b in m.content if b.type == "text")
check(m.type == "message" and m.role == "assistant", f"message shape {m}")
check(len(text) > 0, "some text")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
check(m.usage.output_tokens > 0, f"usage {m.usage}")

# The same conversation through /v1/chat/completions gives the same greedy text.
oa = httpx.post(
    f"{base_url}/chat/completions",
    headers={"Authorization": "Bearer sekrit"},
    json={"model": model, "max_tokens": 48, "temperature": 0,
          "messages": [{"role": "system", "content": system}] + question},
    timeout=120,
).json()
check(oa["choices"][0]["message"]["content"] == text, f"chat completions gave {oa['choices'][0]['message']['content']!r}, messages {text!r}")
check(oa["usage"]["completion_tokens"] == m.usage.output_tokens, "the same token count")

# count_tokens equals the prompt the message ran.
n = client.messages.count_tokens(model=model, system=system, messages=question)
check(n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), f"count_tokens {n.input_tokens} vs usage {m.usage}")
check(n.input_tokens == oa["usage"]["prompt_tokens"], f"count_tokens {n.input_tokens} vs prompt_tokens {oa['usage']['prompt_tokens']}")

# Streamed: the same text, events in Anthropic's order.
names, parts = [], []
with client.messages.stream(model=model, max_tokens=48, system=system, messages=question, extra_body=greedy) as s:
    for ev in s:
        names.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            parts.append(ev.delta.text)
    final = s.get_final_message()
check("".join(parts) == text, f"streamed {''.join(parts)!r} vs {text!r}")
check(len(parts) > 3, "several deltas")
check(names[0] == "message_start" and names[-1] == "message_stop", f"event order {names[:3]}…{names[-3:]}")
check("content_block_start" in names and "content_block_stop" in names and "message_delta" in names, f"events {set(names)}")
check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, f"final {final.stop_reason} {final.usage}")

# Stop sequences: the answer ends before the sequence, and says which.
m2 = client.messages.create(
    model=model, max_tokens=64, messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    stop_sequences=["5"], extra_body=greedy,
)
t2 = "".join(b.text for b in m2.content if b.type == "text")
check(m2.stop_reason == "stop_sequence" and m2.stop_sequence == "5", f"stop {m2.stop_reason} {m2.stop_sequence} {t2!r}")
check("5" not in t2 and "4" in t2, f"text before the stop: {t2!r}")

# Prefill: the answer continues a final assistant message.
m3 = client.messages.create(
    model=model, max_tokens=16, extra_body=greedy,
    messages=[{"role": "user", "content": "What is the capital of France?"},
              {"role": "assistant", "content": "The capital of France is"}],
)
t3 = "".join(b.text for b in m3.content if b.type == "text")
check("Paris" in t3 and not t3.startswith("The capital"), f"prefill continued: {t3!r}")

# A tool loop: tool_choice any gives a valid call; its result gives a text answer.
tools = [{
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
m4 = client.messages.create(model=model, max_tokens=96, tools=tools, tool_choice={"type": "any"}, messages=ask, extra_body=greedy)
uses = [b for b in m4.content if b.type == "tool_use"]
check(m4.stop_reason == "tool_use" and len(uses) >= 1, f"tool use {m4}")
check(uses[0].name == "get_weather", f"tool name {uses[0].name}")
jsonschema.validate(uses[0].input, tools[0]["input_schema"])
check(uses[0].id.startswith("toolu_"), f"id {uses[0].id}")

# Streamed, the same call arrives as input_json_delta.
with client.messages.stream(model=model, max_tokens=96, tools=tools, tool_choice={"type": "any"}, messages=ask, extra_body=greedy) as s:
    final4 = s.get_final_message()
suses = [b for b in final4.content if b.type == "tool_use"]
check([(u.name, u.input) for u in suses] == [(u.name, u.input) for u in uses], f"streamed calls {suses} vs {uses}")

follow = ask + [
    {"role": "assistant", "content": m4.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 degrees Celsius."}]},
]
m5 = client.messages.create(model=model, max_tokens=64, tools=tools, tool_choice={"type": "none"}, messages=follow, extra_body=greedy)
t5 = "".join(b.text for b in m5.content if b.type == "text")
check(m5.stop_reason in ("end_turn", "max_tokens") and len(t5) > 0, f"answer after the result: {m5}")
check(not any(b.type == "tool_use" for b in m5.content), f"tool_choice none gave a call: {m5}")
# The same history as OpenAI messages gives the same text (the 0.5B model's answer
# itself is poor: it echoes calls as text on either endpoint).
oa_history = [
    ask[0],
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": uses[0].id, "type": "function", "function": {"name": uses[0].name, "arguments": json.dumps(uses[0].input)}}]},
    {"role": "tool", "tool_call_id": uses[0].id, "content": "Sunny, 24 degrees Celsius."},
]
oa_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in tools]
oa5 = httpx.post(
    f"{base_url}/chat/completions", headers={"Authorization": "Bearer sekrit"},
    json={"model": model, "max_tokens": 64, "temperature": 0, "messages": oa_history, "tools": oa_tools, "tool_choice": "none"},
    timeout=120,
).json()
check(oa5["choices"][0]["message"]["content"] == t5, f"tool loop: chat completions {oa5['choices'][0]['message']['content']!r} vs messages {t5!r}")

# A named tool.
m6 = client.messages.create(model=model, max_tokens=96, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
                            messages=[{"role": "user", "content": "Hello!"}], extra_body=greedy)
check([b.name for b in m6.content if b.type == "tool_use"][:1] == ["get_weather"], f"named tool {m6}")

# Structured output through output_config.format.
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
m7 = client.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "Invent a person."}],
                            output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body=greedy)
jsonschema.validate(json.loads(m7.content[0].text), schema)

# Errors in Anthropic's shape.
try:
    client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    check(False, "an image block is refused")
except anthropic.BadRequestError as e:
    check(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", f"error body {e.body}")
    check("image" in e.body["error"]["message"], f"error names the block: {e.body}")
try:
    client.messages.create(model=model, max_tokens=2048, messages=question, thinking={"type": "enabled", "budget_tokens": 1024})
    check(False, "thinking on a template without thinking is refused")
except anthropic.BadRequestError as e:
    check("thinking" in e.body["error"]["message"], f"thinking refusal: {e.body}")
bad = anthropic.Anthropic(base_url=root, api_key="wrong", max_retries=0)
try:
    bad.messages.create(model=model, max_tokens=8, messages=question)
    check(False, "a wrong key is refused")
except anthropic.AuthenticationError as e:
    check(e.body["error"]["type"] == "authentication_error", f"401 body {e.body}")

print(f"anthropic: {checks} checks passed")
