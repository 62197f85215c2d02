"""Structured output through `frink serve` with the official `openai` Python package.

Run by crates/cli/tests/serve.rs (structured_output_with_the_openai_client) with the
server's base URL and model name. For every JSON schema below, the greedy answer and three
sampled ones (seeds 1-3): an answer that ends with `finish_reason: "stop"` must parse and
validate against its schema (the `jsonschema` package, draft 2020-12); at least 95% must
end with `stop`. Lark and GBNF grammars likewise (checked with an equivalent Python regex), and
unsupported schema features, GBNF token references, malformed grammars and
`response_format`s are 400s.
Exits non-zero on a failed check; prints a summary line.
"""

import concurrent.futures
import json
import re
import sys
import time

import jsonschema
import openai
from e2e_checks import check, failures

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


S = {"type": "string", "maxLength": 24}
NAME = {"type": "string", "minLength": 1, "maxLength": 20}

# (prompt, schema): real-world shapes, strings and arrays bounded where a small model could
# run on.
SCHEMAS = [
    ("Describe a cat.", {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 30}}, "required": ["name", "age"], "additionalProperties": False}),
    ("Is water wet?", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": False}),
    ("Pick a colour.", {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"], "additionalProperties": False}),
    ("Classify the sentiment of: I love this!", {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["sentiment", "confidence"], "additionalProperties": False}),
    ("List three fruits.", {"type": "object", "properties": {"fruits": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}}, "required": ["fruits"], "additionalProperties": False}),
    ("Give a point.", {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": False}),
    ("Describe a person with an address.", {"type": "object", "properties": {"name": NAME, "address": {"type": "object", "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"], "additionalProperties": False}}, "required": ["name", "address"], "additionalProperties": False}),
    ("Give a date.", {"type": "object", "properties": {"date": {"type": "string", "format": "date"}}, "required": ["date"], "additionalProperties": False}),
    ("Give an email address.", {"type": "object", "properties": {"email": {"type": "string", "format": "email", "maxLength": 40}}, "required": ["email"], "additionalProperties": False}),
    ("Rate a movie.", {"type": "object", "properties": {"title": NAME, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["title", "stars"], "additionalProperties": False}),
    ("A number.", {"type": "integer", "minimum": -100, "maximum": 100}),
    ("A word.", {"type": "string", "pattern": "^[a-z]{1,10}$"}),
    ("Yes or no?", {"enum": ["yes", "no"]}),
    ("Give a value.", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 8}]}),
    ("Give an id.", {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "null"}]}}, "required": ["id"], "additionalProperties": False}),
    ("A tree.", {"$defs": {"leaf": {"type": "object", "properties": {"value": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["value"], "additionalProperties": False}}, "type": "object", "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}}, "required": ["left", "right"], "additionalProperties": False}),
    ("A product.", {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "price": {"type": "number", "minimum": 0, "maximum": 1000}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}, "required": ["sku", "price"], "additionalProperties": False}),
    ("An event.", {"type": "object", "properties": {"name": NAME, "when": {"type": "string", "format": "date-time"}}, "required": ["name", "when"], "additionalProperties": False}),
    ("A task list.", {"type": "object", "properties": {"tasks": {"type": "array", "items": {"type": "object", "properties": {"title": NAME, "done": {"type": "boolean"}}, "required": ["title", "done"], "additionalProperties": False}, "minItems": 1, "maxItems": 2}}, "required": ["tasks"], "additionalProperties": False}),
    ("A const.", {"type": "object", "properties": {"version": {"const": 2}, "name": NAME}, "required": ["version", "name"], "additionalProperties": False}),
    ("Optional fields.", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": S}, "required": ["a"], "additionalProperties": False}),
    ("Coordinates.", {"type": "array", "items": {"type": "number", "minimum": -180, "maximum": 180}, "minItems": 2, "maxItems": 2}),
    ("A tuple.", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 0, "maximum": 99}], "items": False}),
    ("A temperature reading.", {"type": "object", "properties": {"celsius": {"type": "number", "exclusiveMinimum": -274, "maximum": 100}}, "required": ["celsius"], "additionalProperties": False}),
    ("An HTTP status.", {"type": "object", "properties": {"code": {"type": "integer", "minimum": 100, "maximum": 599}, "reason": S}, "required": ["code", "reason"], "additionalProperties": False}),
    ("A user profile.", {"type": "object", "properties": {"username": {"type": "string", "pattern": "^[a-z0-9_]{3,12}$"}, "roles": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "minItems": 1, "maxItems": 3}}, "required": ["username", "roles"], "additionalProperties": False}),
    ("A nullable note.", {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 20}}, "required": ["note"], "additionalProperties": False}),
    ("Extract the city from: I live in Paris.", {"type": "object", "properties": {"city": NAME}, "required": ["city"], "additionalProperties": False}),
    ("A colour in hex.", {"type": "object", "properties": {"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}, "required": ["hex"], "additionalProperties": False}),
    ("A matrix.", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
    ("A recipe.", {"type": "object", "properties": {"dish": NAME, "ingredients": {"type": "array", "items": {"type": "object", "properties": {"item": NAME, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}}, "required": ["item", "grams"], "additionalProperties": False}, "minItems": 1, "maxItems": 2}}, "required": ["dish", "ingredients"], "additionalProperties": False}),
    ("A oneOf.", {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["kind", "n"], "additionalProperties": False}, {"type": "object", "properties": {"kind": {"const": "b"}, "s": S}, "required": ["kind", "s"], "additionalProperties": False}]}),
    ("A map of scores.", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100}, "maxProperties": 3}),
]

# (grammar: llguidance's Lark syntax or llama.cpp's GBNF; Python regex the whole answer must
# match)
LARK = [
    ('%llguidance {}\nstart: "yes" | "no"', r"yes|no"),
    ("%llguidance {}\nstart: /[0-9]{3}-[0-9]{4}/", r"[0-9]{3}-[0-9]{4}"),
    ('%llguidance {}\nstart: item ("," item){0,3}\nitem: /[a-z]{1,8}/', r"[a-z]{1,8}(,[a-z]{1,8}){0,3}"),
    ('%llguidance {}\nstart: "The answer is " /[0-9]{1,3}/ "."', r"The answer is [0-9]{1,3}\."),
    ('root ::= ("yes" | "no") "."', r"(yes|no)\."),
    ('root ::= item ("," space item){0,3}\nitem ::= [a-z]{1,8}\nspace ::= | " "', r"[a-z]{1,8}(, ?[a-z]{1,8}){0,3}"),
    ('root ::= "(" [0-9]{3} ") " [0-9]{3} "-" [0-9]{4}', r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
]


def ask(prompt, seed, **extra):
    kw = {"temperature": 0} if seed is None else {"temperature": 0.8, "seed": seed}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=160, **kw, **extra
    )
    return r.choices[0]


jobs = []
for i, (prompt, schema) in enumerate(SCHEMAS):
    rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    for seed in [None, 1, 2, 3]:
        jobs.append(("schema", i, seed, prompt, schema, {"response_format": rf}))
for i, (grammar, rx) in enumerate(LARK):
    for seed in [None, 1, 2, 3]:
        jobs.append(("lark", i, seed, "Answer briefly.", rx, {"extra_body": {"grammar": grammar}}))

t0 = time.time()
stopped = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    results = list(pool.map(lambda j: (j, ask(j[3], j[2], **j[5])), jobs))
for (kind, i, seed, prompt, spec, _), choice in results:
    text = choice.message.content
    what = f"{kind} {i} seed {seed}: {text!r}"
    if choice.finish_reason != "stop":
        print(f"not stopped ({choice.finish_reason}): {what}", file=sys.stderr)
        continue
    stopped += 1
    if kind == "schema":
        try:
            value = json.loads(text)
            jsonschema.Draft202012Validator(
                spec, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
            ).validate(value)
        except Exception as e:  # noqa: BLE001 - any parse or validation failure fails
            check(False, f"{what}: {type(e).__name__}: {e}")
    else:
        check(re.fullmatch(spec, text) is not None, f"{what} does not match /{spec}/")
check(stopped >= 0.95 * len(jobs), f"only {stopped} of {len(jobs)} answers ended with stop")

# Refusals: a 400 naming the field.
for extra, param in [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format"),
    ({"extra_body": {"json_schema": {"not": {"type": "string"}}}}, "json_schema"),
    ({"extra_body": {"grammar": "root ::= <think> [a-z]*"}}, "grammar"),
    ({"extra_body": {"grammar": 'root ::= "unterminated'}}, "grammar"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
]:
    try:
        ask("Hi.", None, **extra)
        check(False, f"{extra} was accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == param, f"{extra}: param {e.body.get('param')}")

# A keyword whose value constrains nothing is accepted (llguidance alone refuses
# `uniqueItems` whatever its value), and an overlapping oneOf is refused with what the API
# offers instead (not an option of the grammar library no request can set).
r = ask("List two colors.", None, response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": {
    "type": "array", "items": {"type": "string"}, "uniqueItems": False, "maxItems": 3}}})
check(r.finish_reason == "length" or isinstance(json.loads(r.message.content), list), f"uniqueItems: false: {r.message.content!r}")
try:
    ask("Hi.", None, response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": {
        "oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}}})
    check(False, "an overlapping oneOf was accepted")
except openai.BadRequestError as e:
    msg = e.body.get("message", "")
    check("anyOf" in msg and "coerce_one_of" not in msg, f"oneOf message: {msg}")

print(
    f"{len(jobs)} constrained answers ({len(SCHEMAS)} schemas, {len(LARK)} grammars; "
    f"{stopped} ended with stop) in {time.time() - t0:.1f} s; {len(failures)} failures"
)
if failures:
    sys.exit(1)
print("structured checks passed")
