"""Renders every template of this folder through transformers' own chat-template code
(`transformers.utils.chat_template_utils.render_jinja_template`, the function
`apply_chat_template` calls) for the conversations in CASES, and writes reference.json:
the reference for crates/tokenizer/tests/templates.rs, which renders the same through
frink and requires identical strings.

    python3 -m venv /tmp/tfv && /tmp/tfv/bin/pip install transformers jinja2
    /tmp/tfv/bin/python render_reference.py      # transformers 5.24.0 made the committed file

`strftime_now` sees a frozen clock (2026-07-26 14:05:09), as frink's tests pass the same
date. bos_token/eos_token are "<s>"/"</s>" for every template (both renderers get the same).
A template that raises records the exception's message instead of a rendering.
"""
import datetime as _dt
import json
import os
import sys

import transformers
import transformers.utils.chat_template_utils as ctu

FROZEN = _dt.datetime(2026, 7, 26, 14, 5, 9)


class _FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FROZEN


ctu.datetime = _FrozenDatetime

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds brièvement."}
USER = {"role": "user", "content": "What is the capital of France? ünïcode ✓"}
ANSWER = {"role": "assistant", "content": "Paris."}
USER2 = {"role": "user", "content": "And of Italy?"}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_0001",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_0001", "name": "get_weather", "content": "{\"temperature\": 21}"}

CASES = [
    {"name": "user", "messages": [USER], "add_generation_prompt": True},
    {"name": "system_user", "messages": [SYSTEM, USER], "add_generation_prompt": True},
    {"name": "multi_turn", "messages": [SYSTEM, USER, ANSWER, USER2], "add_generation_prompt": True},
    {"name": "no_generation_prompt", "messages": [SYSTEM, USER, ANSWER], "add_generation_prompt": False},
    {"name": "tools", "messages": [SYSTEM, USER], "tools": [WEATHER], "add_generation_prompt": True},
    {
        "name": "tool_call_and_result",
        "messages": [USER, CALL, RESULT],
        "tools": [WEATHER],
        "add_generation_prompt": True,
    },
    {
        # Gemma 4's own form of a call's result: on the model's turn, not a tool message.
        "name": "tool_responses",
        "messages": [USER, dict(CALL, tool_responses=[{"name": "get_weather", "response": {"temperature": 21}}])],
        "tools": [WEATHER],
        "add_generation_prompt": True,
    },
    {"name": "thinking_off", "messages": [USER], "kwargs": {"enable_thinking": False}, "add_generation_prompt": True},
    {"name": "thinking_on", "messages": [USER], "kwargs": {"enable_thinking": True}, "add_generation_prompt": True},
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = {"transformers": transformers.__version__, "frozen_now": FROZEN.isoformat(), "cases": CASES, "renderings": {}}
    for name in sorted(os.listdir(here)):
        if not name.endswith(".jinja"):
            continue
        src = open(os.path.join(here, name), encoding="utf-8").read()
        results = {}
        for case in CASES:
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[json.loads(json.dumps(case["messages"]))],
                    tools=case.get("tools"),
                    chat_template=src,
                    add_generation_prompt=case["add_generation_prompt"],
                    bos_token="<s>",
                    eos_token="</s>",
                    **case.get("kwargs", {}),
                )
                results[case["name"]] = {"text": rendered[0]}
            except Exception as e:  # noqa: BLE001 - the reference records what raised
                results[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
        out["renderings"][name] = results
    with open(os.path.join(here, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in r for t in out["renderings"].values() for r in t.values())
    print(f"{len(out['renderings'])} templates x {len(CASES)} cases; {n_err} raised", file=sys.stderr)


if __name__ == "__main__":
    main()
