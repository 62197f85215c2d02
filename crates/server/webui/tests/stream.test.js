// The stream parser on server-sent events cut anywhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createSseParser } from "../stream.js";

const STREAM = 'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":"x\\ny"}\r\n\r\ndata: [DONE]\n\n';

test("every cut of a stream gives the same payloads", () => {
  const want = ['{"a":1}', '{"b":"x\\ny"}', "[DONE]"];
  for (let cut = 0; cut <= STREAM.length; cut++) {
    for (let cut2 = cut; cut2 <= STREAM.length; cut2 += 7) {
      const p = createSseParser();
      const got = [...p.push(STREAM.slice(0, cut)), ...p.push(STREAM.slice(cut, cut2)), ...p.push(STREAM.slice(cut2)), ...p.end()];
      assert.deepEqual(got, want, `cuts ${cut}, ${cut2}`);
    }
  }
});

test("multi-line data joins with newlines; a last event without its blank line is kept", () => {
  const p = createSseParser();
  assert.deepEqual(p.push("data: one\ndata: two\n\ndata: three"), ["one\ntwo"]);
  assert.deepEqual(p.end(), ["three"]);
});
