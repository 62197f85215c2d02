"""Choosing models by name with the official `openai` client (tests/serve_many.rs runs it).

Usage: python openai_models_e2e.py http://127.0.0.1:PORT/v1 MODE
MODE `router`: a server started without -m: each catalog model answers by name, an
unknown name is a 404 in OpenAI's shape, no name a 400 naming `model`.
MODE `single`: a server started with -m smollm2-135m: a placeholder name reaches it.
Prints "N checks passed".
"""

import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=300)
mode = sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    checks += 1


ASK = [{"role": "user", "content": "Name a colour."}]


def answer(model):
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=10, temperature=0)
    return r.model, r.choices[0].message.content


ids = [m.id for m in client.models.list().data]
if mode == "router":
    check({"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"} <= set(ids), f"listed: {ids}")
    small = answer("smollm2-135m")
    coder = answer("qwen2.5-coder-0.5b")
    check(small[0] == "smollm2-135m" and coder[0] == "qwen2.5-coder-0.5b", f"named: {small} {coder}")
    check(small[1] != coder[1], "two models, two answers")
    check(answer("smollm2-135m:latest")[1] == small[1], "Ollama's :latest tag")
    check(client.models.retrieve("qwen2.5-coder-0.5b").id == "qwen2.5-coder-0.5b", "models.retrieve")
    try:
        client.models.retrieve("gpt-4o")
        check(False, "retrieve of an unknown model")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", f"retrieve 404: {e.body}")
    try:
        answer("gpt-4o")
        check(False, "an unknown model answered")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found" and e.body["param"] == "model" and "gpt-4o" in e.body["message"], f"404: {e.body}")
    try:
        client.chat.completions.create(model="", messages=ASK, max_tokens=4)
        check(False, "no model answered")
    except openai.BadRequestError as e:
        check(e.body["param"] == "model", f"400: {e.body}")
    try:
        client.embeddings.create(model="../models/x", input="hi")
        check(False, "a path answered")
    except openai.BadRequestError as e:
        check("path" in e.body["message"], f"400: {e.body}")
else:
    check(ids[0] == "smollm2-135m", f"the -m model first: {ids}")
    placeholder = answer("gpt-4o")
    named = answer("smollm2-135m")
    check(placeholder[1] == named[1], f"a placeholder reaches the -m model: {placeholder} {named}")
print(f"{checks} checks passed")
