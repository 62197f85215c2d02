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
