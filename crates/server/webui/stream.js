// Server-sent events as the OpenAI-compatible streams send them: `data: …` lines, events
// ended by a blank line, comments (`:`) ignored, `\r\n` or `\n` line ends, chunks cut
// anywhere (inside a line, inside a UTF-8 character: the caller decodes with
// TextDecoder's stream mode).

/** A parser fed text pieces; `push` returns the data payloads of the events they end. */
export function createSseParser() {
  let buf = "";
  let data = [];
  return {
    push(text) {
      buf += text;
      const out = [];
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) out.push(data.join("\n"));
          data = [];
        } else if (line.startsWith(":")) {
          // a comment (keep-alive)
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        }
      }
      return out;
    },
    /** The payload of an event the stream ended without its blank line, if any. */
    end() {
      const last = buf.startsWith("data:") ? [...data, buf.slice(5).replace(/^ /, "")] : data;
      buf = "";
      data = [];
      return last.length ? [last.join("\n")] : [];
    },
  };
}

/** Reads an OpenAI chat stream's `response` body, calling `onChunk(json)` per chunk until
 * `[DONE]`; resolves whether `[DONE]` came (false: the connection closed before it). */
export async function readChatStream(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = createSseParser();
  const handle = (payloads) => {
    for (const p of payloads) {
      if (p === "[DONE]") return true;
      onChunk(JSON.parse(p));
    }
    return false;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return handle(parser.push(decoder.decode()).concat(parser.end()));
    if (handle(parser.push(decoder.decode(value, { stream: true })))) return true;
  }
}
