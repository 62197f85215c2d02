// Conversations kept in the browser (localStorage): each a tree of messages, so editing an
// earlier message or regenerating an answer makes a branch beside the old one; the
// conversation shows the path from its first message to its current leaf.

const KEY = "frink.conversations.v1";

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
  for (let id = conv.leaf; id; id = conv.nodes[id].parent) out.push(conv.nodes[id]);
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
  while (conv.nodes[at].children.length) at = conv.nodes[at].children[conv.nodes[at].children.length - 1];
  conv.leaf = at;
}

/** Every stored conversation, newest first. */
export function loadAll(storage = globalThis.localStorage) {
  try {
    const all = JSON.parse(storage.getItem(KEY) || "[]");
    return Array.isArray(all) ? all.filter((c) => c && c.id && c.nodes).sort((a, b) => b.updated - a.updated) : [];
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
  return list.filter((c) => c && typeof c.id === "string" && c.nodes && typeof c.nodes === "object");
}
