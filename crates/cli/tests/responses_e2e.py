"""End-to-end check of `frink serve`'s Responses API with the official `openai` package.

Run by crates/cli/tests/serve_answers.rs (responses_with_the_openai_client) with the
server's base URL and the model name (qwen2.5-coder-0.5b, whose template teaches Hermes
tool calls). Exits non-zero on the first failed check.
"""

import json
import sys

import jsonschema
import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


instructions = "You are a concise assistant."
question = "Name three primary colors."

# Plain: the same greedy text as /v1/chat/completions for the same conversation.
r = client.responses.create(model=model, instructions=instructions, input=question, temperature=0, max_output_tokens=48)
check(r.object == "response" and r.id.startswith("resp_"), f"response shape {r}")
check(r.status in ("completed", "incomplete"), f"status {r.status}")
check(len(r.output_text) > 0, "some text")
check(r.output[-1].type == "message" and r.output[-1].role == "assistant", f"output {r.output}")
c = client.chat.completions.create(model=model, temperature=0, max_tokens=48,
                                   messages=[{"role": "system", "content": instructions}, {"role": "user", "content": question}])
check(c.choices[0].message.content == r.output_text, f"chat {c.choices[0].message.content!r} vs responses {r.output_text!r}")
check(r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens, f"usage {r.usage} vs {c.usage}")
check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, "total")

# Streamed: events in a valid order (the SDK's accumulator checks every identity), the same text.
types, deltas = [], []
with client.responses.stream(model=model, instructions=instructions, input=question, temperature=0, max_output_tokens=48) as s:
    for ev in s:
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
    final = s.get_final_response()
check(types[0] == "response.created" and types[1] == "response.in_progress", f"start {types[:2]}")
check(types[-1] in ("response.completed", "response.incomplete"), f"end {types[-1]}")
for t in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
          "response.content_part.done", "response.output_item.done"):
    check(t in types, f"{t} in {set(types)}")
check(types.index("response.output_item.added") < types.index("response.output_text.delta") < types.index("response.output_item.done"), "item order")
check("".join(deltas) == r.output_text, f"streamed {''.join(deltas)!r} vs {r.output_text!r}")
check(final.output_text == r.output_text and final.status == r.status, f"final {final.status} {final.output_text!r}")

# text.format with a JSON schema: valid output.
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
j = client.responses.create(model=model, input="Invent a person.", temperature=0, max_output_tokens=64,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
jsonschema.validate(json.loads(j.output_text), schema)
check(j.text.format.type == "json_schema", f"echoed format {j.text}")

# A function-call loop through previous_response_id.
tools = [{"type": "function", "name": "get_weather", "description": "The current weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
r1 = client.responses.create(model=model, input="What is the weather in Paris?", tools=tools, tool_choice="required",
                             temperature=0, max_output_tokens=96)
calls = [o for o in r1.output if o.type == "function_call"]
check(len(calls) >= 1 and calls[0].name == "get_weather", f"calls {r1.output}")
jsonschema.validate(json.loads(calls[0].arguments), tools[0]["parameters"])
check(calls[0].call_id.startswith("call_"), f"call id {calls[0].call_id}")
r2 = client.responses.create(model=model, previous_response_id=r1.id, tools=tools, tool_choice="none", temperature=0,
                             max_output_tokens=64,
                             input=[{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 24 degrees Celsius."} for c in calls])
check(r2.previous_response_id == r1.id, f"previous id {r2.previous_response_id}")
check(len(r2.output_text) > 0 and not any(o.type == "function_call" for o in r2.output), f"answer after the result {r2.output}")
# The same conversation as chat messages gives the same text.
history = [{"role": "user", "content": "What is the weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}]
history += [{"role": "tool", "tool_call_id": c.call_id, "content": "Sunny, 24 degrees Celsius."} for c in calls]
oa = client.chat.completions.create(model=model, messages=history, temperature=0, max_tokens=64, tool_choice="none",
                                    tools=[{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}} for t in tools])
check(oa.choices[0].message.content == r2.output_text, f"loop: chat {oa.choices[0].message.content!r} vs responses {r2.output_text!r}")
check(r2.usage.input_tokens == oa.usage.prompt_tokens, f"loop usage {r2.usage} vs {oa.usage}")

# Retrieval and deletion by id.
got = client.responses.retrieve(r1.id)
check(got.id == r1.id and [o.id for o in got.output] == [o.id for o in r1.output], f"retrieved {got}")
deleted = client.responses.delete(r1.id)
try:
    client.responses.retrieve(r1.id)
    check(False, "a deleted response is gone")
except openai.NotFoundError:
    checks += 1
try:
    client.responses.create(model=model, previous_response_id=r1.id, input="And tomorrow?", max_output_tokens=8)
    check(False, "a deleted previous response is a 404")
except openai.NotFoundError as e:
    check(r1.id in str(e), f"404 names the id: {e}")
nostore = client.responses.create(model=model, input="Hi", store=False, max_output_tokens=4)
try:
    client.responses.retrieve(nostore.id)
    check(False, "store=false keeps nothing")
except openai.NotFoundError:
    checks += 1
try:
    client.responses.cancel(r2.id)
    check(False, "a finished response cannot be cancelled")
except openai.BadRequestError:
    checks += 1

# What frink cannot do is refused by name.
for kw, param in [({"background": True}, "background"), ({"tools": [{"type": "web_search"}]}, "tools"),
                  ({"truncation": "auto"}, "truncation")]:
    try:
        client.responses.create(model=model, input="Hi", max_output_tokens=4, **kw)
        check(False, f"{param} refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == param, f"{param}: {e.body}")

print(f"responses: {checks} checks passed")
