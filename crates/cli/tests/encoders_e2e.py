"""Encoder models through `frink serve` with the official `openai` and `ollama` Python clients.

Run by crates/cli/tests/encoders.rs with the server's base URL, a mode and the fixture folder
(crates/models/tests/data/encoders/<family>: tiny random-weight BERT / XLM-RoBERTa models with
transformers' fp32 outputs in meta.json).

- `embed` (bert, mean pooling): `/v1/embeddings` with strings, with token arrays and with a
  batch of 256 strings gives transformers' vectors (L2-normalised, ≤ 1e-3 relative); the batch's
  vectors are the bits of the same texts sent alone and take a few forward passes, not 256;
  Ollama's `/api/embed` gives the same vectors; `dimensions` is refused (not a Matryoshka model);
  chat completions are a 400 naming the model; `/v1/rerank` is a 400 naming the model.
- `rerank` (xlmr_rank): `/v1/rerank` and `/rerank` give transformers' scores (≤ 1e-3) sorted
  best first with their `index`, `top_n` and `return_documents`, documents as strings or
  objects; TEI's `texts` shape; malformed requests are 400s naming the field.
- `decoder` (a generative model): `/v1/rerank` is a 400 naming the model.
Exits non-zero on a failed check.
"""
import json
import math
import pathlib
import sys
import urllib.error
import urllib.request

import ollama
import openai
from e2e_checks import check, failures

base_url = sys.argv[1].removesuffix("/v1")
mode = sys.argv[2]
fixture = pathlib.Path(sys.argv[3]) if len(sys.argv) > 3 else None
oa = openai.OpenAI(base_url=base_url + "/v1", api_key="none", timeout=300)
ol = ollama.Client(host=base_url, timeout=300)
model = oa.models.list().data[0].id


def post(path, body):
    """(status, JSON body) of a POST."""
    req = urllib.request.Request(base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def metric(name):
    with urllib.request.urlopen(base_url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def normalised(v):
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def rel(a, b):
    scale = max(abs(x) for x in b)
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def embed_checks():
    meta = json.loads((fixture / "meta.json").read_text())
    cases = meta["cases"]
    texts = [c["text"] for c in cases]
    got = [d.embedding for d in oa.embeddings.create(model=model, input=texts).data]
    worst = max(rel(g, normalised(c["embedding"])) for g, c in zip(got, cases))
    print(f"embeddings: ≤ {worst:.2e} relative to transformers")
    check(worst < 1e-3, f"embeddings differ from transformers' by {worst}")
    ids = oa.embeddings.create(model=model, input=cases[0]["hf_ids"]).data[0].embedding
    check(ids == got[0], "a token array gives the text's vector")
    # 256 inputs: each the bits of the same text alone, in a few passes.
    many = [texts[i % len(texts)] + f" number {i}" for i in range(256)]
    steps0 = metric("frink_forward_steps_total")
    batch = oa.embeddings.create(model=model, input=many).data
    steps = metric("frink_forward_steps_total") - steps0
    print(f"256 inputs in {steps:.0f} forward passes")
    check(len(batch) == 256 and [d.index for d in batch] == list(range(256)), "256 vectors in order")
    check(steps <= 16, f"256 inputs took {steps} forward passes")
    for i in (0, 77, 255):
        alone = oa.embeddings.create(model=model, input=many[i]).data[0].embedding
        check(alone == batch[i].embedding, f"input {i} alone and in the batch of 256")
    o = ol.embed(model=model, input=texts)
    check(all(rel(a, b) < 1e-6 for a, b in zip(o.embeddings, got)), "ollama /api/embed gives the same vectors")
    status, body = post("/v1/embeddings", {"model": model, "input": "word " * 300})
    check(status == 400 and "context_length" in body["error"]["message"], f"an input past the positions: {status} {body}")
    status, body = post("/v1/embeddings", {"model": model, "input": "x", "dimensions": 8})
    check(status == 400 and body["error"]["param"] == "dimensions", f"dimensions refused: {status} {body}")
    try:
        oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        check(False, "chat on an encoder is refused")
    except openai.BadRequestError as e:
        check("encoder" in str(e) and model in str(e), f"the refusal names the model: {e}")
    status, body = post("/v1/rerank", {"model": model, "query": "q", "documents": ["d"]})
    check(status == 400 and model in body["error"]["message"], f"rerank without a head: {status} {body}")


def rerank_checks():
    meta = json.loads((fixture / "meta.json").read_text())
    cases = meta["cases"]
    query = cases[0]["query"]
    same = [c for c in cases if c["query"] == query]
    docs = [c["document"] for c in same]
    status, body = post("/v1/rerank", {"model": model, "query": query, "documents": docs})
    check(status == 200, f"rerank: {status} {body}")
    results = body["results"]
    scores = [r["relevance_score"] for r in results]
    check(scores == sorted(scores, reverse=True), "results best first")
    check(sorted(r["index"] for r in results) == list(range(len(docs))), "every index once")
    worst = max(abs(r["relevance_score"] - same[r["index"]]["score"]) for r in results)
    print(f"rerank: {len(docs)} documents, scores within {worst:.2e} of transformers")
    check(worst < 1e-3, f"scores differ from transformers' by {worst}")
    check(body["usage"]["prompt_tokens"] == sum(len(c["hf_ids"]) for c in same), "usage counts the pairs' tokens")
    # Every case (their queries differ) one at a time: transformers' score.
    for c in cases:
        s, b = post("/rerank", {"query": c["query"], "documents": [{"text": c["document"]}]})
        check(s == 200 and abs(b["results"][0]["relevance_score"] - c["score"]) < 1e-3, f"/rerank {c['query']!r}")
    s, b = post("/v1/rerank", {"query": query, "documents": docs, "top_n": 1, "return_documents": True})
    check(s == 200 and len(b["results"]) == 1, "top_n 1")
    check(b["results"][0]["index"] == results[0]["index"], "top_n keeps the best")
    check(b["results"][0]["document"]["text"] == docs[results[0]["index"]], "return_documents")
    s, b = post("/rerank", {"query": query, "texts": docs, "return_text": True})
    check(s == 200 and isinstance(b, list) and "score" in b[0] and "text" in b[0], f"TEI shape: {b}")
    # TEI's scores are sigmoids unless raw_scores.
    by_index = {r["index"]: r["relevance_score"] for r in results}
    check(all(abs(r["score"] - 1 / (1 + math.exp(-by_index[r["index"]]))) < 1e-6 for r in b), "TEI sigmoid scores")
    s, raw = post("/rerank", {"query": query, "texts": docs, "raw_scores": True})
    check(s == 200 and all(abs(r["score"] - by_index[r["index"]]) < 1e-6 for r in raw), "TEI raw_scores")
    s, b = post("/rerank", {"query": query, "texts": docs, "documents": docs})
    check(s == 400 and b["error"]["param"] == "texts", f"documents and texts: {s} {b}")
    s, b = post("/rerank", {"query": query, "texts": docs, "truncate": True})
    check(s == 400 and b["error"]["param"] == "truncate", f"truncate: {s} {b}")
    s, b = post("/v1/rerank", {"query": "word " * 300, "documents": docs})
    check(s == 400 and b["error"]["param"] == "query", f"a query past the positions: {s} {b}")
    for bad, param in [({"documents": docs}, "query"), ({"query": query}, "documents"),
                       ({"query": query, "documents": []}, "documents"),
                       ({"query": query, "documents": [1]}, "documents"),
                       ({"query": query, "documents": docs, "top_n": -1}, "top_n"),
                       ({"query": 5, "documents": docs}, "query")]:
        s, b = post("/v1/rerank", bad)
        check(s == 400 and b["error"]["param"] == param, f"{bad}: {s} {b}")


def queue_checks():
    """A server with `--queue 4`: 8 clients × 10 inputs at once (more inputs than the
    queue holds). Each is answered: its 10 vectors, each the bits of its input alone, or a
    503 when other requests' inputs fill the queue (CONTRACT.md); never a dropped
    connection (a full queue once made the server panic mid-request)."""
    import concurrent.futures
    texts = [[f"client {c} text {i} about free software" for i in range(10)] for c in range(8)]

    def one(batch):
        return post("/v1/embeddings", {"model": model, "input": batch})

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(one, texts))
    print("statuses under a full queue:", [s for s, _ in got])
    check(all(s in (200, 503) for s, _ in got), f"200 or 503 each: {[s for s, _ in got]}")
    check(any(s == 200 for s, _ in got), "some client was served")
    for c, (s, body) in enumerate(got):
        if s == 200:
            check(len(body["data"]) == 10, f"client {c} got its 10 vectors")
            alone = oa.embeddings.create(model=model, input=texts[c][7]).data[0].embedding
            check(body["data"][7]["embedding"] == alone, f"client {c}: an input equals it alone")
        else:
            check("queue" in body["error"]["message"], f"client {c}: {body}")
    status, body = post("/v1/embeddings", {"model": model, "input": "x", "encoding_format": "float", "dimensions": 3})
    check(status == 400, f"dimensions: {status}")
    status, body = post("/embeddings", {"content": "x", "embd_normalize": 4294967298})
    check(status == 400 and body["error"]["param"] == "embd_normalize", f"embd_normalize range: {status} {body}")


def decoder_checks():
    status, body = post("/v1/rerank", {"model": model, "query": "q", "documents": ["d"]})
    check(status == 400 and model in body["error"]["message"], f"a decoder asked to rerank: {status} {body}")


{"embed": embed_checks, "rerank": rerank_checks, "queue": queue_checks, "decoder": decoder_checks}[mode]()
if failures:
    sys.exit(1)
print("encoder checks passed")
