// frink's chat page: speaks the server's own OpenAI-compatible API (/v1/models,
// /v1/chat/completions streamed), keeps conversations in the browser, and renders answers
// as Markdown as they stream in.

import { renderMarkdown, escapeHtml } from "./markdown.js";
import { readChatStream } from "./stream.js";
import { newConversation, addMessage, thread, siblings, selectBranch, loadAll, saveAll, parseImport } from "./conversations.js";

const $ = (id) => document.getElementById(id);
const SETTINGS_KEY = "frink.settings.v1";
const API_KEY = "frink.apiKey";

const state = {
  conversations: loadAll(),
  current: null,
  models: [],
  controller: null,
  attachments: [],
};

function apiKey() {
  return localStorage.getItem(API_KEY) || "";
}

/** `fetch` with the stored API key; a 401 asks for a key (up to three times, saying
 * when the last one was refused) and tries again; a cancelled prompt gives the 401. */
async function api(path, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = { ...(init.headers || {}) };
    if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
    const r = await fetch(path, { ...init, headers });
    if (r.status !== 401 || attempt === 3) return r;
    const given = await askKey(attempt > 0 || apiKey() ? "That key was refused." : "");
    if (!given) return r;
  }
}

// An API key as an HTTP header carries it: printable ASCII, no spaces at its ends.
const KEY_SHAPE = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/;

/** Asks for the key; resolves true once one is stored, false when the dialog is closed. */
function askKey(message) {
  return new Promise((resolve) => {
    const dlg = $("key-dialog");
    $("key-error").hidden = !message;
    $("key-error").textContent = message;
    $("key-input").value = "";
    $("key-form").onsubmit = (e) => {
      const key = $("key-input").value;
      if (!KEY_SHAPE.test(key)) {
        e.preventDefault();
        $("key-error").hidden = false;
        $("key-error").textContent = "A key is printable ASCII without spaces at its ends.";
        return;
      }
      localStorage.setItem(API_KEY, key);
      dlg.onclose = null;
      resolve(true);
    };
    dlg.onclose = () => {
      dlg.onclose = null;
      resolve(false);
    };
    if (!dlg.open) dlg.showModal();
  });
}

async function errorOf(r) {
  try {
    const j = await r.json();
    return (j.error && (j.error.message || j.error)) || JSON.stringify(j);
  } catch {
    return `${r.status} ${r.statusText}`;
  }
}

function showError(msg) {
  $("error").hidden = !msg;
  $("error").textContent = msg || "";
}

// ---- settings ----

const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "schema"];

function loadSettings() {
  let s = {};
  try {
    s = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") || {};
  } catch {
    // unreadable settings: the defaults
  }
  for (const f of FIELDS) $(f).value = typeof s[f] === "string" ? s[f] : "";
}

function saveSettings() {
  const s = {};
  for (const f of FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(s));
}

/** The request's sampling fields and response format from the settings (an error for a bad schema). */
function requestOptions() {
  const o = {};
  for (const f of ["temperature", "top_p"]) if ($(f).value !== "") o[f] = Number($(f).value);
  for (const f of ["max_tokens", "seed"]) if ($(f).value !== "") o[f] = parseInt($(f).value, 10);
  const schema = $("schema").value.trim();
  $("settings-error").hidden = true;
  if (schema) {
    try {
      o.response_format = { type: "json_schema", json_schema: { name: "answer", schema: JSON.parse(schema), strict: true } };
    } catch (e) {
      $("settings-error").hidden = false;
      $("settings-error").textContent = `The JSON schema is not JSON: ${e.message}`;
      throw e;
    }
  }
  return o;
}

// ---- models ----

async function loadModels() {
  const r = await api("/v1/models");
  if (!r.ok) {
    showError(`Cannot list the models: ${await errorOf(r)}`);
    return;
  }
  const data = (await r.json()).data || [];
  // Loaded models first.
  state.models = data.sort((a, b) => (b.status?.value === "loaded") - (a.status?.value === "loaded"));
  const sel = $("model");
  const keep = localStorage.getItem("frink.model");
  sel.innerHTML = state.models
    .map((m) => `<option value="${escapeHtml(m.id)}">${escapeHtml(m.id)}${m.status?.value === "loaded" ? "" : " (loads on use)"}</option>`)
    .join("");
  if (keep && state.models.some((m) => m.id === keep)) sel.value = keep;
  modelChanged();
}

function modelChanged() {
  localStorage.setItem("frink.model", $("model").value);
  const m = state.models.find((x) => x.id === $("model").value);
  const vision = !!m && (m.capabilities || []).includes("vision");
  $("attach").hidden = !vision;
  if (!vision) setAttachments([]);
}

// ---- conversations ----

function persist() {
  try {
    saveAll(state.conversations);
  } catch (e) {
    showError(`The conversations cannot be saved in this browser (${e.message}); export them or delete some.`);
  }
  renderList();
}

function current() {
  if (!state.current) {
    state.current = newConversation();
    state.conversations.unshift(state.current);
  }
  return state.current;
}

function renderList() {
  const ul = $("conversations");
  ul.innerHTML = "";
  for (const c of state.conversations) {
    if (!c.leaf) continue;
    const li = document.createElement("li");
    li.className = c === state.current ? "current" : "";
    li.innerHTML =
      `<button type="button" class="open" title="${escapeHtml(c.title)}">${escapeHtml(c.title)}</button>` +
      `<button type="button" class="small rename" aria-label="Rename ${escapeHtml(c.title)}">✎</button>` +
      `<button type="button" class="small delete" aria-label="Delete ${escapeHtml(c.title)}">×</button>`;
    li.querySelector(".open").onclick = () => openConversation(c);
    li.querySelector(".rename").onclick = () => {
      const t = prompt("Name of the conversation", c.title);
      if (t && t.trim()) {
        c.title = t.trim();
        persist();
      }
    };
    li.querySelector(".delete").onclick = () => {
      if (state.controller && c === state.current) return;
      if (!confirm(`Delete "${c.title}"?`)) return;
      state.conversations = state.conversations.filter((x) => x !== c);
      if (state.current === c) state.current = null;
      persist();
      renderMessages();
    };
    ul.appendChild(li);
  }
}

function openConversation(c) {
  if (state.controller) return;
  state.current = c;
  $("sidebar").classList.remove("open");
  renderList();
  renderMessages();
}

// ---- messages ----

function statsText(s) {
  if (!s) return "";
  const parts = [`${s.tokens} tokens`];
  if (s.tps) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (s.ttft != null) parts.push(`first token ${(s.ttft / 1000).toFixed(2)} s`);
  if (s.stopped) parts.push("stopped");
  return parts.join(" · ");
}

function messageView(conv, node) {
  const div = document.createElement("div");
  div.className = `msg ${node.role}`;
  div.dataset.id = node.id;
  const sib = siblings(conv, node.id);
  const nav = sib.ids.length > 1
    ? `<span class="branches"><button type="button" class="prev" aria-label="Previous version">‹</button> ${sib.index + 1}/${sib.ids.length} <button type="button" class="next" aria-label="Next version">›</button></span>`
    : "";
  const actions = node.role === "user"
    ? `<span class="actions"><button type="button" class="edit" aria-label="Edit this message">Edit</button></span>`
    : `<span class="actions"><button type="button" class="regenerate" aria-label="Regenerate this answer">Regenerate</button></span>`;
  div.innerHTML =
    `<div class="who">${node.role === "user" ? "You" : escapeHtml(node.model || "Assistant")} ${nav} ${actions}` +
    `<span class="stats">${escapeHtml(statsText(node.stats))}</span></div><div class="body"></div>`;
  fillBody(div.querySelector(".body"), node);
  const go = (d) => {
    if (state.controller) return;
    selectBranch(conv, sib.ids[sib.index + d]);
    persist();
    renderMessages();
  };
  div.querySelector(".prev")?.addEventListener("click", () => sib.index > 0 && go(-1));
  div.querySelector(".next")?.addEventListener("click", () => sib.index < sib.ids.length - 1 && go(1));
  div.querySelector(".edit")?.addEventListener("click", () => editMessage(conv, node, div));
  div.querySelector(".regenerate")?.addEventListener("click", () => regenerate(conv, node));
  return div;
}

/** Fills a message's body; a message that cannot be rendered shows as plain text. */
function fillBody(body, node) {
  try {
    fillBodyOrThrow(body, node);
  } catch (e) {
    body.textContent = String(node.content || "");
    console.warn("a message could not be rendered:", e);
  }
}

function fillBodyOrThrow(body, node) {
  if (node.role === "user") {
    body.textContent = node.content;
    for (const url of node.images || []) {
      const img = document.createElement("img");
      img.className = "attached";
      img.alt = "attached image";
      img.src = url;
      body.prepend(img);
    }
    return;
  }
  let html = "";
  if (node.reasoning) html += `<details class="reasoning"><summary>Reasoning</summary>${escapeHtml(node.reasoning)}</details>`;
  html += renderMarkdown(node.content || "");
  for (const t of (node.toolCalls || []).filter(Boolean)) {
    html += `<div class="tool-call">Tool call: ${escapeHtml(t.name || "")}(${escapeHtml(t.arguments || "")})</div>`;
  }
  if (node.error) html += `<p class="error">${escapeHtml(node.error)}</p>`;
  body.innerHTML = html;
}

function renderMessages() {
  const box = $("messages");
  box.innerHTML = "";
  if (!state.current) return;
  for (const node of thread(state.current)) box.appendChild(messageView(state.current, node));
  box.scrollTop = box.scrollHeight;
}

function editMessage(conv, node, div) {
  if (state.controller) return;
  const body = div.querySelector(".body");
  body.innerHTML = `<textarea class="edit-box" rows="3" aria-label="Edit the message"></textarea><div><button type="button" class="save">Send as a new branch</button> <button type="button" class="cancel">Cancel</button></div>`;
  const ta = body.querySelector("textarea");
  ta.value = node.content;
  ta.focus();
  body.querySelector(".cancel").onclick = () => renderMessages();
  body.querySelector(".save").onclick = () => {
    if (!validOptions()) return;
    const id = addMessage(conv, node.parent, { role: "user", content: ta.value, images: node.images || [] });
    persist();
    renderMessages();
    answer(conv, id);
  };
}

function regenerate(conv, node) {
  if (state.controller || !validOptions()) return;
  conv.leaf = node.parent;
  answer(conv, node.parent);
}

/** Whether the settings make a request (a JSON schema that parses), showing why not. */
function validOptions() {
  try {
    requestOptions();
    return true;
  } catch {
    return false;
  }
}

/** The API messages of the thread ending at `leaf` (the system prompt first). */
function apiMessages(conv, leaf) {
  const saved = conv.leaf;
  conv.leaf = leaf;
  const path = thread(conv);
  conv.leaf = saved;
  const out = [];
  if ($("system").value.trim()) out.push({ role: "system", content: $("system").value });
  for (const n of path) {
    if (n.role === "user" && n.images && n.images.length) {
      out.push({ role: "user", content: [...n.images.map((url) => ({ type: "image_url", image_url: { url } })), { type: "text", text: n.content }] });
    } else {
      const m = { role: n.role, content: n.content || "" };
      out.push(m);
    }
  }
  return out;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("input").disabled = false;
  document.body.classList.toggle("busy", busy);
}

/** Streams an answer to the message `parent` as a new branch under it. */
async function answer(conv, parent) {
  showError("");
  let options;
  try {
    options = requestOptions();
  } catch {
    return;
  }
  if (!$("model").value) await loadModels(); // (a key given only now, say)
  const model = $("model").value;
  const messages = apiMessages(conv, parent);
  const id = addMessage(conv, parent, { role: "assistant", content: "", model });
  const node = conv.nodes[id];
  renderMessages();
  const view = $("messages").querySelector(`[data-id="${id}"] .body`);
  const statsEl = $("messages").querySelector(`[data-id="${id}"] .stats`);
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const t0 = performance.now();
  let tFirst = null;
  let usage = null;
  let pending = false;
  const paint = () => {
    pending = false;
    fillBody(view, node);
    const box = $("messages");
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
  };
  const schedule = () => {
    if (!pending) {
      pending = true;
      requestAnimationFrame(paint);
    }
  };
  try {
    const r = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model, messages, stream: true, stream_options: { include_usage: true }, ...options }),
      signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorOf(r));
    const complete = await readChatStream(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta;
      if (!delta) return;
      if (tFirst == null && (delta.content || delta.reasoning_content)) tFirst = performance.now();
      if (delta.content) node.content += delta.content;
      if (delta.reasoning_content) node.reasoning = (node.reasoning || "") + delta.reasoning_content;
      for (const tc of delta.tool_calls || []) {
        node.toolCalls = node.toolCalls || [];
        const slot = (node.toolCalls[tc.index ?? 0] ||= { name: "", arguments: "" });
        if (tc.function?.name) slot.name += tc.function.name;
        if (tc.function?.arguments) slot.arguments += tc.function.arguments;
      }
      schedule();
    });
    if (!complete) throw new Error("The connection closed before the answer was complete.");
  } catch (e) {
    if (e.name === "AbortError") node.stopped = true;
    else {
      node.error = e.message;
      showError(e.message);
    }
  }
  const t1 = performance.now();
  const tokens = usage?.completion_tokens ?? null;
  node.stats = tokens != null || node.stopped
    ? {
        tokens: tokens ?? 0,
        ttft: tFirst != null ? tFirst - t0 : null,
        tps: tFirst != null && t1 > tFirst && tokens > 1 ? (tokens - 1) / ((t1 - tFirst) / 1000) : null,
        stopped: !!node.stopped,
      }
    : null;
  $("status").textContent = node.error ? `Error: ${node.error}` : node.stopped ? "Answer stopped." : "Answer complete.";
  state.controller = null;
  setBusy(false);
  fillBody(view, node);
  statsEl.textContent = statsText(node.stats);
  conv.updated = Date.now();
  persist();
  $("input").focus();
}

async function send() {
  const text = $("input").value;
  if (!text.trim() && !state.attachments.length) return;
  if (state.controller || !validOptions()) return;
  const conv = current();
  const id = addMessage(conv, conv.leaf, { role: "user", content: text, images: state.attachments.slice() });
  $("input").value = "";
  setAttachments([]);
  persist();
  renderMessages();
  await answer(conv, id);
}

// ---- images ----

function setAttachments(list) {
  state.attachments = list;
  const box = $("attachments");
  box.innerHTML = "";
  list.forEach((url, i) => {
    const fig = document.createElement("figure");
    fig.innerHTML = `<img alt="image to send ${i + 1}"><button type="button" aria-label="Remove image ${i + 1}">✕</button>`;
    fig.querySelector("img").src = url;
    fig.querySelector("button").onclick = () => setAttachments(state.attachments.filter((_, j) => j !== i));
    box.appendChild(fig);
  });
}

function addImageFiles(files) {
  if ($("attach").hidden) return;
  for (const f of files) {
    if (!f.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.onload = () => setAttachments([...state.attachments, reader.result]);
    reader.readAsDataURL(f);
  }
}

// ---- import / export ----

function exportAll() {
  const blob = new Blob([JSON.stringify(state.conversations, null, 1)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "frink-conversations.json";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function importFile(file) {
  try {
    const list = parseImport(await file.text());
    const known = new Set(state.conversations.map((c) => c.id));
    for (const c of list) if (!known.has(c.id)) state.conversations.push(c);
    state.conversations.sort((a, b) => b.updated - a.updated);
    persist();
  } catch (e) {
    showError(`Cannot import: ${e.message}`);
  }
}

// ---- wiring ----

function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller) state.controller.abort();
  });
  $("stop").onclick = () => state.controller && state.controller.abort();
  $("new-chat").onclick = () => {
    if (state.controller) return;
    state.current = null;
    renderList();
    renderMessages();
    $("input").focus();
  };
  $("model").onchange = modelChanged;
  $("settings-toggle").onclick = () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  };
  $("settings").addEventListener("input", saveSettings);
  $("export").onclick = exportAll;
  $("import").onclick = () => $("import-file").click();
  $("import-file").onchange = (e) => {
    if (e.target.files[0]) importFile(e.target.files[0]);
    e.target.value = "";
  };
  $("attach").onclick = () => $("image-file").click();
  $("image-file").onchange = (e) => addImageFiles(e.target.files);
  $("open-side").onclick = () => $("sidebar").classList.add("open");
  $("close-side").onclick = () => $("sidebar").classList.remove("open");
  document.addEventListener("paste", (e) => addImageFiles([...(e.clipboardData?.files || [])]));
  document.addEventListener("dragover", (e) => {
    e.preventDefault();
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
  document.addEventListener("drop", (e) => {
    e.preventDefault();
    document.body.classList.remove("dragging");
    addImageFiles([...(e.dataTransfer?.files || [])]);
  });
  $("messages").addEventListener("click", (e) => {
    const btn = e.target.closest("button.copy");
    if (!btn) return;
    const code = btn.closest(".code").querySelector("code").textContent;
    navigator.clipboard?.writeText(code).then(() => {
      btn.textContent = "Copied";
      setTimeout(() => (btn.textContent = "Copy"), 1200);
    }, () => {});
  });
}

async function start() {
  wire();
  loadSettings();
  state.current = state.conversations[0] || null;
  try {
    renderList();
    renderMessages();
  } catch (e) {
    showError(`A stored conversation could not be shown: ${e.message}`);
  }
  $("input").disabled = false;
  $("send").disabled = false;
  document.body.dataset.ready = String(Math.round(performance.now()));
  await loadModels();
  document.body.dataset.models = "loaded";
}

start();
