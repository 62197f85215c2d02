// Markdown to HTML for answers as they stream in: every piece of text is escaped first, so
// nothing the model writes becomes markup of its own; a fence not yet closed is a code
// block up to the end of the text (a half-received answer renders as it will once
// complete). Covers what chat answers use: fenced and indented code (highlighted, with a
// copy button), headings, lists, block quotes, rules, tables, paragraphs; inline code,
// bold, italic, strikethrough, links (http, https and mailto only).

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** `s` with HTML's special characters escaped. */
export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ESC[c]);
}

const KEYWORDS = new Set(
  ("as async await break case catch class const continue def default del do elif else enum " +
    "export extends false fn for from func function go if impl import in interface let loop " +
    "match mod mut new nil None not null or package pass pub raise return self Self static " +
    "struct super switch this throw true True False try type typeof use var void where while " +
    "with yield and int float str bool char string u8 u16 u32 u64 i32 i64 usize f32 f64 " +
    "public private protected final try except lambda unsafe trait dyn ref")
    .split(" "),
);

// One token of code: a comment (`//`, `/* */`, and `#` or `--` in the languages where
// they start one), a string, a number, a word, or any other character.
const STRING = `("(?:\\\\.|[^"\\\\\\n])*"?|'(?:\\\\.|[^'\\\\\\n])*'?|\`(?:\\\\.|[^\`\\\\])*\`?)`;
const REST = `(\\b\\d[\\d_.]*(?:e[+-]?\\d+)?[a-z]*\\b|\\b0x[0-9a-f]+\\b)|([A-Za-z_][A-Za-z0-9_]*)|([\\s\\S])`;

function tokenizer(lang) {
  const comments = ["\\/\\/[^\\n]*", "\\/\\*[\\s\\S]*?(?:\\*\\/|$)"];
  if (/^(py|python|sh|bash|shell|zsh|ruby|rb|r|yaml|yml|toml|perl|make|dockerfile)$/i.test(lang || "")) comments.push("#[^\\n]*");
  if (/^(sql|lua|haskell|hs)$/i.test(lang || "")) comments.push("--[^\\n]*");
  return new RegExp(`(${comments.join("|")})|${STRING}|${REST}`, "gi");
}

/** Code with its comments, strings, numbers and keywords in spans (classes `c-*`). */
export function highlight(code, lang) {
  let out = "";
  for (const m of code.matchAll(tokenizer(lang))) {
    const [text, comment, str, num, word] = m;
    if (comment) out += `<span class="c-comment">${escapeHtml(text)}</span>`;
    else if (str) out += `<span class="c-string">${escapeHtml(text)}</span>`;
    else if (num) out += `<span class="c-number">${escapeHtml(text)}</span>`;
    else if (word && KEYWORDS.has(word)) out += `<span class="c-keyword">${text}</span>`;
    else out += escapeHtml(text);
  }
  return out;
}

/** Inline markup of one line or paragraph `s` (escaped as it goes). Every pattern is
 * bounded, so no input makes it slow: a span longer than its bound stays text. */
export function inline(s) {
  const held = [];
  const hold = (html) => {
    held.push(html);
    return `\u0000${held.length - 1}\u0000`;
  };
  // The placeholders' character cannot come from the text.
  let t = s.replace(/\u0000/g, "");
  // Code spans first: their text is literal.
  t = t.replace(/(`{1,8})([^`\n][\s\S]{0,2000}?)\1(?!`)/g, (_, __, c) => hold(`<code>${escapeHtml(c)}</code>`));
  // Links next, whole (no emphasis inside their address).
  t = t.replace(/\[([^\][\n]{1,500})\]\(((?:https?:\/\/|mailto:)[^\s()<>"']{1,2000})\)/g, (_, label, url) =>
    hold(`<a href="${escapeHtml(url)}" target="_blank" rel="noopener noreferrer">${escapeHtml(label)}</a>`));
  t = escapeHtml(t);
  t = t.replace(/\*\*([^*\n]{1,500})\*\*/g, "<strong>$1</strong>");
  t = t.replace(/__([^_\n]{1,500})__/g, "<strong>$1</strong>");
  t = t.replace(/(^|[^*\w])\*([^*\n]{1,500})\*(?!\*)/g, "$1<em>$2</em>");
  t = t.replace(/(^|[^_\w])_([^_\n]{1,500})_(?!\w)/g, "$1<em>$2</em>");
  t = t.replace(/~~([^~\n]{1,500})~~/g, "<del>$1</del>");
  return t.replace(/\u0000(\d+)\u0000/g, (_, i) => held[Number(i)] ?? "");
}

function codeBlock(code, lang) {
  const label = lang ? `<span class="lang">${escapeHtml(lang)}</span>` : "<span class=\"lang\"></span>";
  return (
    `<div class="code"><div class="code-head">${label}` +
    `<button type="button" class="copy" aria-label="Copy code">Copy</button></div>` +
    `<pre><code${lang ? ` data-lang="${escapeHtml(lang)}"` : ""}>${highlight(code, lang)}</code></pre></div>`
  );
}

function table(rows) {
  const cells = (r) => r.replace(/^\s*\|/, "").replace(/\|\s*$/, "").split("|").map((c) => inline(c.trim()));
  const head = cells(rows[0]);
  const body = rows.slice(2).map(cells);
  return (
    "<table><thead><tr>" + head.map((c) => `<th>${c}</th>`).join("") + "</tr></thead><tbody>" +
    body.map((r) => "<tr>" + r.map((c) => `<td>${c}</td>`).join("") + "</tr>").join("") +
    "</tbody></table>"
  );
}

/** Whether `line` is a table's separator row: only `|`, `:`, `-` and spaces, with a `|`
 * and a `-` (checked without a regular expression: no backtracking on long lines). */
function isTableRule(line) {
  let bar = false;
  let dash = false;
  for (const c of line) {
    if (c === "|") bar = true;
    else if (c === "-") dash = true;
    else if (c !== ":" && c !== " " && c !== "\t") return false;
  }
  return bar && dash;
}

/** A heading's text without its closing run of `#`s. */
function headingText(t) {
  const trimmed = t.trimEnd();
  let end = trimmed.length;
  while (end > 0 && trimmed[end - 1] === "#") end--;
  return end < trimmed.length && (end === 0 || trimmed[end - 1] === " ") ? trimmed.slice(0, end).trimEnd() : trimmed;
}

/** Blocks nested deeper than this (quotes in quotes, lists in lists) stay text. */
const MAX_DEPTH = 16;

/** The HTML of Markdown `src` (complete or cut anywhere). */
export function renderMarkdown(src, depth = 0) {
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  let html = "";
  let para = [];
  const flush = () => {
    if (para.length) html += `<p>${para.map(inline).join("<br>")}</p>`;
    para = [];
  };
  for (let i = 0; i < lines.length; ) {
    const line = lines[i];
    const fence = line.match(/^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) body.push(lines[i++]);
      i++; // the closing fence (or past the end: an unclosed fence runs to the end)
      html += codeBlock(body.join("\n"), fence[2]);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      const n = heading[1].length;
      html += `<h${n}>${inline(headingText(heading[2]))}</h${n}>`;
      i++;
      continue;
    }
    if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      html += "<hr>";
      i++;
      continue;
    }
    const isRow = (l) => l.trim().startsWith("|") && l.trim().endsWith("|") && l.trim().length > 1;
    if (isRow(line) && i + 1 < lines.length && isTableRule(lines[i + 1])) {
      flush();
      const rows = [];
      while (i < lines.length && isRow(lines[i])) rows.push(lines[i++]);
      html += table(rows);
      continue;
    }
    if (/^\s{0,3}>/.test(line) && depth < MAX_DEPTH) {
      flush();
      const quoted = [];
      while (i < lines.length && /^\s{0,3}>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
      html += `<blockquote>${renderMarkdown(quoted.join("\n"), depth + 1)}</blockquote>`;
      continue;
    }
    const item = line.match(/^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/);
    if (item && depth < MAX_DEPTH) {
      flush();
      const ordered = /\d/.test(item[2]);
      const start = ordered ? parseInt(item[2], 10) : 1;
      const items = [];
      while (i < lines.length) {
        const m = lines[i].match(/^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/);
        if (m && m[1].length <= item[1].length + 1 && /\d/.test(m[2]) === ordered) {
          items.push([m[3]]);
          i++;
        } else if (items.length && lines[i].trim() !== "" && /^\s+/.test(lines[i])) {
          items[items.length - 1].push(lines[i].trim());
          i++;
        } else break;
      }
      const tag = ordered ? "ol" : "ul";
      const attr = ordered && start !== 1 ? ` start="${start}"` : "";
      html += `<${tag}${attr}>` + items.map((it) => `<li>${renderMarkdown(it.join("\n"), depth + 1).replace(/^<p>([\s\S]*)<\/p>$/, "$1")}</li>`).join("") + `</${tag}>`;
      continue;
    }
    if (/^( {4}|\t)/.test(line) && !para.length) {
      const body = [];
      while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || lines[i].trim() === "")) body.push(lines[i++].replace(/^( {4}|\t)/, ""));
      while (body.length && body[body.length - 1].trim() === "") body.pop();
      html += codeBlock(body.join("\n"), "");
      continue;
    }
    if (line.trim() === "") {
      flush();
      i++;
      continue;
    }
    para.push(line);
    i++;
  }
  flush();
  return html;
}
