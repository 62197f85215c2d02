// Conversations kept in the browser (localStorage): each a tree of messages, so editing an
// earlier message or regenerating an answer makes a branch beside the old one; the
// conversation shows the path from its first message to its current leaf.

const KEY = "frink.conversations.v1";

const str = (v, max = 1 << 20) => (typeof v === "string" ? v.slice(0, max) : "");
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** A stored or imported conversation made safe to show, or null: every field of the type
 * the page reads, images only as `data:image/` URLs, parents that exist and form no
 * cycle, children rebuilt from the parents, a leaf that exists. */
export function sanitize(c) {
  if (!c || typeof c !== "object" || typeof c.id !== "string" || !c.nodes || typeof c.nodes !== "object") return null;
  const nodes = {};
  for (const [id, n] of Object.entries(c.nodes)) {
    if (!n || typeof n !== "object" || (n.role !== "user" && n.role !== "assistant")) continue;
    const stats = n.stats && typeof n.stats === "object" && num(n.stats.tokens) != null
      ? { tokens: num(n.stats.tokens), ttft: num(n.stats.ttft), tps: num(n.stats.tps), stopped: n.stats.stopped === true }
      : null;
    nodes[id] = {
      id,
      parent: typeof n.parent === "string" ? n.parent : null,
      children: [],
      role: n.role,
      content: str(n.content),
      ...(typeof n.model === "string" ? { model: str(n.model, 200) } : {}),
      ...(typeof n.reasoning === "string" ? { reasoning: str(n.reasoning) } : {}),
      ...(typeof n.error === "string" ? { error: str(n.error, 2000) } : {}),
      images: Array.isArray(n.images) ? n.images.filter((u) => typeof u === "string" && u.startsWith("data:image/")) : [],
      toolCalls: Array.isArray(n.toolCalls)
        ? n.toolCalls.filter((t) => t && typeof t === "object").map((t) => ({ name: str(t.name, 200), arguments: str(t.arguments) }))
        : [],
      stats,
    };
  }
  // Parents that exist, and no cycles: a node whose parents come back to it starts anew.
  for (const n of Object.values(nodes)) {
    if (n.parent && !nodes[n.parent]) n.parent = null;
  }
  for (const n of Object.values(nodes)) {
    const seen = new Set([n.id]);
    for (let p = n.parent; p; p = nodes[p].parent) {
      if (seen.has(p)) {
        n.parent = null;
        break;
      }
      seen.add(p);
    }
  }
  for (const n of Object.values(nodes)) if (n.parent) nodes[n.parent].children.push(n.id);
  const ids = Object.keys(nodes);
  const next = 1 + Math.max(0, ...ids.map((id) => Number(id.slice(1)) || 0));
  return {
    id: str(c.id, 100),
    title: str(c.title, 200) || "Conversation",
    created: num(c.created) ?? Date.now(),
    updated: num(c.updated) ?? Date.now(),
    nodes,
    leaf: typeof c.leaf === "string" && nodes[c.leaf] ? c.leaf : ids[ids.length - 1] ?? null,
    next,
  };
}

/** A fresh conversation. */
export function newConversation(now = Date.now()) {
  return { id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`, title: "New chat", created: now, updated: now, nodes: {}, leaf: null, next: 1 };
}

/** Adds a message under `parent` (null: a first message) and makes it the leaf; returns its id. */
export function addMessage(conv, parent, message) {
  const id = `m${conv.next++}`;
  conv.nodes[id] = { id, parent, children: [], ...message };
  if (parent) conv.nodes[parent].children.push(id);
  conv.leaf = id;
  conv.updated = Date.now();
  if (conv.title === "New chat" && message.role === "user") conv.title = message.content.slice(0, 60) || "New chat";
  return id;
}

/** The messages from the first one to the leaf. */
export function thread(conv) {
  const out = [];
  const seen = new Set();
  for (let id = conv.leaf; id && conv.nodes[id] && !seen.has(id); id = conv.nodes[id].parent) {
    seen.add(id);
    out.push(conv.nodes[id]);
  }
  return out.reverse();
}

/** The messages of the same parent as `id` (its branches, in order), and its index among them. */
export function siblings(conv, id) {
  const parent = conv.nodes[id].parent;
  const ids = parent ? conv.nodes[parent].children : Object.values(conv.nodes).filter((n) => !n.parent).map((n) => n.id);
  return { ids, index: ids.indexOf(id) };
}

/** Makes the leaf the last message down the most recent branches from `id`. */
export function selectBranch(conv, id) {
  let at = id;
  const seen = new Set();
  while (conv.nodes[at].children.length && !seen.has(at)) {
    seen.add(at);
    at = conv.nodes[at].children[conv.nodes[at].children.length - 1];
  }
  conv.leaf = at;
}

/** Every stored conversation, newest first. */
export function loadAll(storage = globalThis.localStorage) {
  try {
    const all = JSON.parse(storage.getItem(KEY) || "[]");
    return Array.isArray(all) ? all.map(sanitize).filter(Boolean).sort((a, b) => b.updated - a.updated) : [];
  } catch {
    return [];
  }
}

/** Stores `all`. */
export function saveAll(all, storage = globalThis.localStorage) {
  storage.setItem(KEY, JSON.stringify(all));
}

/** Conversations read from an export (one conversation or a list of them); invalid ones dropped. */
export function parseImport(text) {
  const data = JSON.parse(text);
  const list = Array.isArray(data) ? data : [data];
  return list.map(sanitize).filter(Boolean);
}
