// Stored and imported conversations are made safe before the page reads them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { sanitize, thread, addMessage, newConversation, parseImport } from "../conversations.js";

test("a sound conversation keeps its messages and branches", () => {
  const c = newConversation(1);
  const q = addMessage(c, null, { role: "user", content: "hi", images: [] });
  addMessage(c, q, { role: "assistant", content: "a", stats: { tokens: 3, ttft: 10, tps: 5 } });
  const b = addMessage(c, q, { role: "assistant", content: "b" });
  const s = sanitize(JSON.parse(JSON.stringify(c)));
  assert.deepEqual(thread(s).map((n) => n.content), ["hi", "b"]);
  assert.equal(s.nodes[q].children.length, 2);
  assert.equal(s.leaf, b);
  assert.equal(s.next, c.next);
});

test("damaged conversations are repaired or dropped, never thrown at the page", () => {
  const base = { id: "c1", title: "t", created: 1, updated: 1 };
  const cases = [
    { ...base, nodes: { m1: { role: "user", content: "a", parent: null } }, leaf: "m9" },
    { ...base, nodes: { m1: null, m2: { role: "user", content: 5 } }, leaf: "m2" },
    { ...base, nodes: { m1: { role: "user", parent: "m2" }, m2: { role: "assistant", parent: "m1" } }, leaf: "m1" },
    { ...base, nodes: { m1: { role: "assistant", stats: { tokens: 2, tps: "fast" }, images: 5, toolCalls: [null, { name: 7 }] } }, leaf: "m1" },
    { ...base, title: 5, nodes: { m1: { role: "user", images: ["javascript:alert(1)", "data:image/png;base64,AA"] } } },
  ];
  for (const [i, c] of cases.entries()) {
    const s = sanitize(c);
    assert.ok(s, `case ${i}`);
    const t = thread(s);
    assert.ok(t.length >= 1, `case ${i}: a thread`);
    for (const n of t) {
      assert.equal(typeof n.content, "string");
      assert.ok(Array.isArray(n.images) && n.images.every((u) => u.startsWith("data:image/")));
      assert.ok(n.stats === null || typeof n.stats.tokens === "number");
    }
  }
  assert.equal(sanitize({ id: "x", nodes: "str" }), null);
  assert.equal(sanitize(null), null);
  assert.equal(sanitize(cases[4]).title, "Conversation");
  assert.deepEqual(parseImport(JSON.stringify([cases[2], { nope: 1 }])).length, 1);
});
