// The trace page of `fleet serve`: plain ES modules, no build step, nothing fetched from
// another origin. `/` is the front page; `/?trace=ROOT[&open=ID][&view=timeline]` a tree.
"use strict";

import { renderActions } from "./actions.js";
import { renderConversation } from "./conversation.js";
import { renderPlan } from "./plan.js";
import { startFront } from "./front.js";
import { draw, fold, schedule, seed, startTimeline, timeline } from "./timeline.js";
import { renderRollups, setDetail, setTrace, tree } from "./tree.js";
import { $, api, headers, post, saveToken, showError, traceUrl } from "./util.js";

const FLUSH_MS = 250;
const MANY_DIRTY = 25;
const page = {
  root: null,          // the root trace id shown
  opened: null,        // the trace whose conversation is open
  lastEventId: "0",    // the last SSE id handled: a reconnect resumes after it
  reconnects: 0,
  events: 0,
  lastEventAt: 0,      // performance.now() when the last event was folded in
  timings: {},         // render times (ms since navigation) the browser test records
  dirty: new Set(),
  flushing: false,
  refreshing: new Map(), // trace id -> "busy" | "again"
  tree,
  timeline,
  draw,                // redraw the timeline now (the render test times it)
};
window.fleetPage = page; // for people and tests poking at the page
page.lastTool = tree.lastTool;

// --- the tree: one listing, then details of what changed ------------------------------

async function loadListing() {
  const body = await api("/api/traces?root=" + encodeURIComponent(page.root) + "&limit=1000");
  for (const trace of body.traces) { setTrace(trace); seed(trace); }
  renderRollups(page.root);
}

// One request per trace at a time; events arriving meanwhile ask for one more.
async function refresh(id) {
  if (page.refreshing.has(id)) { page.refreshing.set(id, "again"); return; }
  page.refreshing.set(id, "busy");
  try {
    const detail = await api(traceUrl(id));
    setDetail(detail);
    seed(detail.trace);
    renderRollups(page.root);
    if (id === page.opened) await showTrace(detail);  // its failure is shown, not thrown
  } catch (error) {
    showError(error.message);
  } finally {
    const again = page.refreshing.get(id) === "again";
    page.refreshing.delete(id);
    if (again) refresh(id);
  }
}

function markDirty(id) {
  page.dirty.add(id);
  if (page.flushing) return;
  page.flushing = true;
  setTimeout(flush, FLUSH_MS);
}

async function flush() {
  const ids = Array.from(page.dirty);
  page.dirty.clear();
  try {
    if (ids.length > MANY_DIRTY) {  // a wide tree moving: one listing beats many details
      await loadListing();
      for (const id of [page.root, page.opened]) if (id && ids.includes(id)) refresh(id);
    } else {
      for (const id of ids) refresh(id);
    }
  } catch (error) {
    showError(error.message);
  } finally {
    page.flushing = false;
    if (page.dirty.size) markDirty(Array.from(page.dirty)[0]);
  }
}

function onEvent(event) {
  page.events += 1;
  const data = event.data || {};
  if (event.kind === "message" && data.tools && data.tools.length) {
    tree.lastTool.set(event.trace_id, data.tools[data.tools.length - 1]);
  }
  fold(event);
  page.lastEventAt = performance.now();
  if (!event.trace_id.startsWith("human:")) markDirty(event.trace_id);
  if (data.parent_trace_id) markDirty(data.parent_trace_id);
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

async function readStream(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      handleBlock(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
  }
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
      await readStream(response);
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

// --- the open trace -------------------------------------------------------------------

async function openTrace(id) {
  page.opened = id;
  const params = new URLSearchParams(location.search);
  if (id === page.root) params.delete("open"); else params.set("open", id);
  history.replaceState(null, "", "?" + params.toString());
  $("messages").hidden = false;
  $("messages-title").textContent = id;
  $("message-list").replaceChildren();
  try {
    showTrace(await api(traceUrl(id)));
  } catch (error) {
    showError(error.message);
  }
}

async function showTrace(detail) {
  const id = detail.trace.trace_id;
  renderActions(detail, () => refresh(id));
  const body = await api(traceUrl(id, "/messages"));
  if (page.opened !== id) return;
  renderConversation(body, detail);
  $("messages").dataset.loaded = String(body.messages.length);
  renderPlan(id, () => page.opened === id);  // live: every refresh of the open trace
}

function closeTrace() {
  $("messages").hidden = true;
  page.opened = null;
}

// --- views ----------------------------------------------------------------------------

function showView(name) {
  for (const view of ["tree", "timeline"]) {
    $("tab-" + view).setAttribute("aria-selected", String(view === name));
    $(view === "tree" ? "tree-root" : "timeline").hidden = view !== name;
  }
  const params = new URLSearchParams(location.search);
  if (name === "timeline") params.set("view", "timeline"); else params.delete("view");
  history.replaceState(null, "", "?" + params.toString());
  if (name === "timeline") draw();
}

async function openTree(root, opened, view) {
  page.root = root;
  $("tree").hidden = false;
  tree.onOpen = openTrace;
  timeline.onOpen = openTrace;
  startTimeline();
  showView(view === "timeline" ? "timeline" : "tree");
  await loadListing();
  await refresh(root);
  schedule();
  page.timings.listed_ms = performance.now();
  follow(root);
  openTrace(opened || root); // the root's conversation and actions unless another is asked for
}

function keys(event) {
  if (event.target.tagName === "INPUT" || event.target.tagName === "TEXTAREA") return;
  if (event.key === "Escape") closeTrace();
  if (event.key === "t" && page.root) showView($("timeline").hidden ? "timeline" : "tree");
  if ((event.key === "j" || event.key === "k") && page.root) {
    const heads = Array.from(document.querySelectorAll(".node-head"));
    const at = heads.indexOf(document.activeElement);
    const next = heads[Math.max(0, Math.min(heads.length - 1, at + (event.key === "j" ? 1 : -1)))];
    if (next) next.focus();
  }
}

function start() {
  if (location.hash.startsWith("#token=")) {
    saveToken(decodeURIComponent(location.hash.slice(7)));
    history.replaceState(null, "", location.pathname + location.search);
  }
  $("token-save").addEventListener("click", () => { saveToken($("token-input").value); location.reload(); });
  $("open-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("open-input").value.trim();
    if (id) location.search = "?trace=" + encodeURIComponent(id);
  });
  $("stop").addEventListener("click", async () => {
    try {
      await post(traceUrl(page.root, "/stop"), {});
    } catch (error) {
      showError(error.message);
    }
  });
  $("tab-tree").addEventListener("click", () => showView("tree"));
  $("tab-timeline").addEventListener("click", () => showView("timeline"));
  $("messages-close").addEventListener("click", closeTrace);
  document.addEventListener("keydown", keys);
  const params = new URLSearchParams(location.search);
  const root = params.get("trace");
  (root ? openTree(root, params.get("open"), params.get("view")) : startFront())
    .catch((error) => showError(error.message));
}

start();
