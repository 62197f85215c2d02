// The Markdown renderer: escaping, the blocks chat answers use, and text cut anywhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import { renderMarkdown, highlight } from "../markdown.js";

const ANSWER = [
  "# Title",
  "",
  "Some **bold**, *italic*, `code <b>` and a [link](https://example.org/x).",
  "",
  "- one",
  "- two",
  "",
  "1. first",
  "2. second",
  "",
  "```python",
  "def f(x):  # a comment",
  '    return "<tag>" + 1',
  "```",
  "",
  "| a | b |",
  "|---|---|",
  "| 1 | 2 |",
  "",
  "> quoted",
].join("\n");

test("blocks and inline markup", () => {
  const h = renderMarkdown(ANSWER);
  assert.match(h, /<h1>Title<\/h1>/);
  assert.match(h, /<strong>bold<\/strong>/);
  assert.match(h, /<em>italic<\/em>/);
  assert.match(h, /<code>code &lt;b&gt;<\/code>/);
  assert.match(h, /<a href="https:\/\/example.org\/x" target="_blank" rel="noopener noreferrer">link<\/a>/);
  assert.match(h, /<ul><li>one<\/li><li>two<\/li><\/ul>/);
  assert.match(h, /<ol><li>first<\/li><li>second<\/li><\/ol>/);
  assert.match(h, /<span class="c-keyword">def<\/span>/);
  assert.match(h, /<span class="c-comment"># a comment<\/span>/);
  assert.match(h, /<span class="c-string">&quot;&lt;tag&gt;&quot;<\/span>/);
  assert.match(h, /<table><thead><tr><th>a<\/th><th>b<\/th><\/tr><\/thead><tbody><tr><td>1<\/td><td>2<\/td><\/tr><\/tbody><\/table>/);
  assert.match(h, /<blockquote><p>quoted<\/p><\/blockquote>/);
  assert.match(h, /<button type="button" class="copy" aria-label="Copy code">Copy<\/button>/);
});

test("nothing the model writes becomes markup", () => {
  const evil = '<img src=x onerror=alert(1)> <script>x</script> [a](javascript:alert(1)) "quote" `<i>`';
  const h = renderMarkdown(evil + "\n```\n<script>\n```");
  assert.doesNotMatch(h, /<img|<script|<i>|href="javascript/);
  assert.match(h, /&lt;script&gt;/);
});

test("every prefix of an answer renders, a half-received fence as code", () => {
  for (let n = 0; n <= ANSWER.length; n++) {
    const h = renderMarkdown(ANSWER.slice(0, n));
    assert.equal(typeof h, "string");
    // Tags balance: each opened block closes.
    for (const tag of ["pre", "code", "table", "ul", "ol", "blockquote", "p"]) {
      const open = (h.match(new RegExp(`<${tag}[ >]`, "g")) || []).length;
      const close = (h.match(new RegExp(`</${tag}>`, "g")) || []).length;
      assert.equal(open, close, `prefix ${n}: <${tag}> ${open} vs ${close}`);
    }
  }
  const half = renderMarkdown("Look:\n```rust\nfn main() {\n    let x = 1;");
  assert.match(half, /<pre><code data-lang="rust"><span class="c-keyword">fn<\/span> main\(\) \{\n    <span class="c-keyword">let<\/span> x = <span class="c-number">1<\/span>;<\/code><\/pre>/);
});

test("highlighting escapes every token", () => {
  assert.equal(highlight('a < "b&" // c', "js"), 'a &lt; <span class="c-string">&quot;b&amp;&quot;</span> <span class="c-comment">// c</span>');
});

test("hostile text neither overflows the stack nor takes long", () => {
  const n = 100_000;
  const cases = {
    "hashes in a js fence": "```js\n" + "#".repeat(n) + "\n```",
    "dashes in a python fence": "```python\n" + "-".repeat(n) + "\n```",
    "nested quotes": ">".repeat(n),
    "nested ordered lists": "1. ".repeat(n / 3),
    "nested bullets": "- * ".repeat(n / 4),
    "table rule with spaces": "|a|\n" + " ".repeat(n) + "x",
    "run of brackets": "[".repeat(n),
    "heading with spaces": "# a" + " ".repeat(n) + "b",
    "stars and spaces": "* ".repeat(n / 2) + "x",
    "backticks": "`".repeat(n),
    "underscores": "_a ".repeat(n / 3),
  };
  for (const [name, text] of Object.entries(cases)) {
    const t0 = performance.now();
    const h = renderMarkdown(text);
    const ms = performance.now() - t0;
    assert.equal(typeof h, "string", name);
    // Measured 0 to 61 ms each; the regular expressions that backtracked took 7 to 18 s
    // and the recursions overflowed the stack.
    assert.ok(ms < 1500, `${name}: ${ms.toFixed(0)} ms`);
  }
});

test("links keep their address whole and placeholders cannot be forged", () => {
  const h = renderMarkdown("[a](https://x/*y) b* and __x__ \u00000\u0000 `code`");
  assert.match(h, /<a href="https:\/\/x\/\*y" target="_blank" rel="noopener noreferrer">a<\/a> b\*/);
  assert.match(h, /<strong>x<\/strong> 0 <code>code<\/code>/);
});
