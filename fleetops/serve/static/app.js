// The live trace page of `fleet serve`. Plain DOM, no build step.
// Everything a model or a task wrote is untrusted: it only ever reaches the page as
// textContent (never parsed as HTML), and ids only through encodeURIComponent.
"use strict";

const TOKEN_KEY = "fleet-serve-token";
const page = {
  root: null,          // the root trace id shown
  lastEventId: "0",    // the last SSE id handled: a reconnect resumes after it
  reconnects: 0,
  events: 0,
  lastTool: new Map(), // trace id -> last tool name seen in the event stream
  refreshing: new Map(), // trace id -> "busy" | "again"
};
window.fleetPage = page; // for people and tests poking at the page

function $(id) { return document.getElementById(id); }

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function headers(extra) {
  const out = Object.assign({}, extra || {});
  const value = token();
  if (value) out.Authorization = "Bearer " + value;
  return out;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function api(path, options) {
  const opts = Object.assign({ cache: "no-store" }, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) {
    $("auth").hidden = false;
    throw new Error("this service needs a bearer token");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function traceUrl(id, suffix) {
  return "/api/traces/" + encodeURIComponent(id) + (suffix || "");
}

function tokens(stats) {
  return (stats.prompt_tokens || 0) + (stats.completion_tokens || 0);
}

// --- the tree -------------------------------------------------------------------------

function nodeFor(id) {
  return document.querySelector('.node[data-trace-id="' + CSS.escape(id) + '"]');
}

function makeNode(id, parentId) {
  const node = el("li", "node");
  node.dataset.traceId = id;
  const head = el("div", "node-head");
  head.append(el("span", "node-name", id), el("span", "status", "…"), el("span", "node-id", id));
  head.addEventListener("click", () => showMessages(id));
  node.append(head, el("div", "node-task"), el("div", "node-facts"));
  node.append(el("ul", "collaborators"), el("ul", "children"));
  const container = parentId ? childList(parentId) : $("tree-root");
  // Ids sort as they were spawned (explore-001, -002, ...): keep that order on screen.
  const next = Array.from(container.children).find((other) => other.dataset.traceId > id);
  container.insertBefore(node, next || null);
  return node;
}

function childList(parentId) {
  const parent = nodeFor(parentId) || makeNode(parentId, null);
  return parent.querySelector(":scope > .children");
}

function render(detail) {
  const trace = detail.trace;
  const node = nodeFor(trace.trace_id) || makeNode(trace.trace_id, trace.parent_trace_id);
  node.dataset.status = trace.status;
  node.querySelector(".node-name").textContent = trace.name || trace.mode;
  node.querySelector(".status").textContent = trace.status;
  node.querySelector(".node-task").textContent = trace.task.slice(0, 300);
  const tool = page.lastTool.get(trace.trace_id) || trace.last_tool || "–";
  const facts = [
    "iteration " + trace.iteration,
    tokens(trace.stats) + " tokens",
    "$" + Number(trace.stats.cost_usd || 0).toFixed(4),
    "last tool " + tool,
  ];
  if (trace.metadata && trace.metadata.stop_reason) facts.push("reason " + trace.metadata.stop_reason);
  node.querySelector(".node-facts").textContent = facts.join(" · ");
  const list = node.querySelector(":scope > .collaborators");
  list.replaceChildren(...detail.collaborators.map((c) => {
    const item = el("li", "collaborator", c.name + " [" + c.type + ", " + c.status + "]: " + c.summary);
    item.dataset.traceId = c.trace_id;
    return item;
  }));
  for (const child of detail.children) {
    if (!nodeFor(child.trace_id)) refresh(child.trace_id);
  }
}

// One request per trace at a time; events arriving meanwhile ask for one more.
async function refresh(id) {
  if (page.refreshing.has(id)) { page.refreshing.set(id, "again"); return; }
  page.refreshing.set(id, "busy");
  try {
    render(await api(traceUrl(id)));
  } catch (error) {
    showError(error.message);
  } finally {
    const again = page.refreshing.get(id) === "again";
    page.refreshing.delete(id);
    if (again) refresh(id);
  }
}

function onEvent(event) {
  page.events += 1;
  const data = event.data || {};
  if (event.kind === "message" && data.tools && data.tools.length) {
    page.lastTool.set(event.trace_id, data.tools[data.tools.length - 1]);
  }
  refresh(event.trace_id);
  if (data.parent_trace_id) refresh(data.parent_trace_id);
}

// --- Server-Sent Events over fetch (EventSource cannot send an Authorization header) ---

function handleBlock(block) {
  let id = null;
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "data") data += (data ? "\n" : "") + value;
  }
  if (data) onEvent(JSON.parse(data));
  if (id !== null) page.lastEventId = id;
}

async function follow(root) {
  while (page.root === root) {
    try {
      const extra = { Accept: "text/event-stream" };
      if (page.lastEventId !== "0") extra["Last-Event-ID"] = page.lastEventId;
      const response = await fetch(traceUrl(root, "/events"), { headers: headers(extra), cache: "no-store" });
      if (response.status === 401) { $("auth").hidden = false; return; }
      if (!response.ok) throw new Error("event stream: HTTP " + response.status);
      setConn("live");
      showError("");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          handleBlock(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (error) {
      showError(error.message);
    }
    page.reconnects += 1;
    setConn("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function setConn(state) {
  const conn = $("conn");
  conn.dataset.state = state;
  conn.textContent = state;
}

// --- messages -----------------------------------------------------------------------

async function showMessages(id) {
  const panel = $("messages");
  panel.hidden = false;
  $("messages-title").textContent = id;
  const list = $("message-list");
  list.replaceChildren();
  try {
    const body = await api(traceUrl(id, "/messages"));
    list.replaceChildren(...body.messages.map(renderMessage));
  } catch (error) {
    showError(error.message);
  }
}

// A message's content is text, or parts: text, and images stored by reference (never bytes).
function contentText(content) {
  if (!Array.isArray(content)) return content;
  return content.map((part) => {
    if (part.type === "text") return part.text || "";
    const ref = part.image_ref || {};
    const kind = String(ref.media_type || "image/?").replace("image/", "").toUpperCase();
    const kb = (Number(ref.bytes) || 0) / 1000;
    return "[image " + kind + " " + ref.width + "x" + ref.height + ", " + kb.toFixed(1) + " KB]";
  }).join("\n");
}

function renderMessage(message) {
  const item = el("li", "message");
  item.dataset.role = message.role;
  const label = message.role + (message.name ? " · " + message.name : "") + " #" + message.sequence;
  item.append(el("div", "role", label));
  const content = contentText(message.content);
  if (content) item.append(el("pre", "content", content));
  for (const call of message.tool_calls || []) {
    const fn = call.function || {};
    item.append(el("pre", "tool-call", "→ " + fn.name + "(" + fn.arguments + ")"));
  }
  return item;
}

// --- start ----------------------------------------------------------------------------

async function listRoots() {
  $("traces").hidden = false;
  const body = await api("/api/traces?limit=100");
  $("trace-list").replaceChildren(...body.traces.filter((t) => !t.parent_trace_id).map((t) => {
    const item = el("li");
    const link = el("a", null, t.trace_id);
    link.href = "?trace=" + encodeURIComponent(t.trace_id);
    item.append(link, el("span", "status", t.status), el("span", "node-task", " " + t.task.slice(0, 120)));
    return item;
  }));
}

async function openTree(root) {
  page.root = root;
  $("tree").hidden = false;
  const body = await api("/api/traces?root=" + encodeURIComponent(root) + "&limit=1000");
  for (const trace of body.traces) refresh(trace.trace_id);
  follow(root);
}

function start() {
  if (location.hash.startsWith("#token=")) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(location.hash.slice(7)));
    history.replaceState(null, "", location.pathname + location.search);
  }
  $("token-save").addEventListener("click", () => {
    sessionStorage.setItem(TOKEN_KEY, $("token-input").value);
    location.reload();
  });
  $("open-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("open-input").value.trim();
    if (id) location.search = "?trace=" + encodeURIComponent(id);
  });
  $("stop").addEventListener("click", async () => {
    try {
      await api(traceUrl(page.root, "/stop"), { method: "POST" });
    } catch (error) {
      showError(error.message);
    }
  });
  const root = new URLSearchParams(location.search).get("trace");
  (root ? openTree(root) : listRoots()).catch((error) => showError(error.message));
}

start();
