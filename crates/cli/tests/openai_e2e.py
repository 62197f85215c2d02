"""End-to-end check of `frink serve` with the official `openai` Python package.

Run by crates/cli/tests/serve.rs (openai_python_client_end_to_end) with the server's base
URL as the only argument; exits non-zero on the first failed check.
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


# Models list.
models = client.models.list()
ids = [m.id for m in models.data]
check(ids[0] == "smollm2-135m", f"models list, the -m model first: {ids}")

# Chat completion, greedy.
messages = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three primary colors."},
]
r = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=48)
answer = r.choices[0].message.content
check(r.object == "chat.completion", "chat object")
check(r.choices[0].message.role == "assistant", "assistant role")
check(answer.startswith("The primary colors are"), f"chat answer: {answer!r}")
check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
check(r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")

# Streaming chat: the same text, the finish reason, usage at the end.
stream = client.chat.completions.create(
    model="smollm2-135m", messages=messages, temperature=0, max_tokens=48, stream=True,
    stream_options={"include_usage": True},
)
parts, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts) == answer, f"streamed text {''.join(parts)!r} vs {answer!r}")
check(len(parts) > 3, "the stream came in several deltas")
check(finish == "stop", f"stream finish {finish}")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"stream usage {usage}")

# Completion with a token budget.
c = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=8)
check(c.choices[0].text.startswith(" Paris"), f"completion text {c.choices[0].text!r}")
check(c.choices[0].finish_reason == "length", "completion finish length")
check(c.usage.completion_tokens == 8, f"completion usage {c.usage}")

# Log-probabilities (chat and completion).
r = client.chat.completions.create(
    model="smollm2-135m", messages=messages, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3,
)
lp = r.choices[0].logprobs.content
check(len(lp) == 5, f"one logprob per token: {len(lp)}")
for t in lp:
    check(t.logprob <= 0 and len(t.top_logprobs) == 3, f"logprob entry {t}")
    # Greedy: the chosen token is the most likely one.
    check(abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6, f"greedy token is the top one: {t}")
check("".join(t.token for t in lp) == r.choices[0].message.content, "logprob tokens spell the text")
c = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=3, logprobs=2)
check(c.choices[0].logprobs.tokens[0] == " Paris", f"completion logprobs {c.choices[0].logprobs}")
check(len(c.choices[0].logprobs.top_logprobs[0]) == 2, "two alternatives")

# Stop strings: never in the text, streamed or not.
full = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=16).choices[0].text
stop = full[4:9]
cut = full[: full.index(stop)]
s = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=16, stop=[stop])
check(s.choices[0].text == cut and s.choices[0].finish_reason == "stop", f"stop: {s.choices[0].text!r} vs {cut!r}")
streamed = "".join(
    ch.choices[0].text for ch in client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=16, stop=stop, stream=True,
    ) if ch.choices
)
check(streamed == cut, f"streamed stop: {streamed!r} vs {cut!r}")

# Seed reproducibility: the same seed gives the same sampled text, another seed differs.
def sampled(seed):
    return client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Tell me a story about a dragon."}],
        temperature=1.0, max_tokens=32, seed=seed,
    ).choices[0].message.content

a, b, other = sampled(7), sampled(7), [sampled(s) for s in (8, 9, 10)]
check(a == b, f"same seed, same text: {a!r} vs {b!r}")
check(any(o != a for o in other), "other seeds give other text")

# Errors come back as OpenAI errors.
try:
    client.chat.completions.create(model="smollm2-135m", messages=[], max_tokens=4)
    check(False, "empty messages must fail")
except openai.BadRequestError as e:
    check(e.status_code == 400, "400 for empty messages")

print(f"openai e2e: {checks} checks passed")
