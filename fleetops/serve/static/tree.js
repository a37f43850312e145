// The tree view: one node per trace (status, task, iteration, tokens, cost, last tool,
// collaborators), subtree roll-ups, and the tree's totals against its budget.
"use strict";

import { $, count, cut, el, fields, money, tokens, usd } from "./util.js";

const TERMINAL = new Set(["completed", "failed", "stopped"]);

export const tree = {
  traces: new Map(),      // trace id -> summary (or the trace of a detail)
  collaborators: new Map(), // trace id -> collaborator entries
  lastTool: new Map(),    // trace id -> last tool name (events or detail)
  budget: null,
  models: new Map(),      // trace id -> {model: turns}
  onOpen: null,           // called with a trace id when a node is opened
};

function nodeFor(id) {
  return document.querySelector('.node[data-trace-id="' + CSS.escape(id) + '"]');
}

function makeNode(id, parentId) {
  const node = el("li", "node");
  node.dataset.traceId = id;
  const head = el("div", "node-head");
  head.tabIndex = 0;
  head.setAttribute("role", "button");
  head.append(el("span", "node-name", id), el("span", "status", "…"), el("span", "node-id", id));
  head.addEventListener("click", () => tree.onOpen(id));
  head.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); tree.onOpen(id); }
  });
  node.append(head, el("div", "node-task"), el("div", "node-facts"), el("div", "node-rollup"));
  node.append(el("ul", "collaborators"), el("ul", "children"));
  const container = parentId ? childList(parentId) : $("tree-root");
  container.append(node); // placed in spawn order once its creation time is known (`place`)
  return node;
}

// Children in the order they were spawned: by creation time, then id (explore-001, -002).
function before(a, b) {
  const at = Number(a.dataset.created || 0);
  const bt = Number(b.dataset.created || 0);
  return at !== bt ? at < bt : a.dataset.traceId < b.dataset.traceId;
}

function place(node) {
  const container = node.parentElement;
  const next = Array.from(container.children).find((other) => other !== node && before(node, other));
  if (next !== node.nextElementSibling) container.insertBefore(node, next || null);
}

function childList(parentId) {
  const parent = nodeFor(parentId) || makeNode(parentId, null);
  return parent.querySelector(":scope > .children");
}

export function setTrace(trace) {
  tree.traces.set(trace.trace_id, trace);
  const node = nodeFor(trace.trace_id) || makeNode(trace.trace_id, trace.parent_trace_id);
  node.dataset.status = trace.status;
  if (trace.created_at_ms && node.dataset.created !== String(trace.created_at_ms)) {
    node.dataset.created = String(trace.created_at_ms);
    place(node);
  }
  node.querySelector(".node-name").textContent = trace.name || trace.mode;
  node.querySelector(".status").textContent = trace.status;
  const task = node.querySelector(".node-task");
  task.textContent = cut(trace.task, 300);
  task.title = trace.task.length > 300 ? cut(trace.task, 2000) : "";
  const tool = tree.lastTool.get(trace.trace_id) || trace.last_tool || "–";
  const facts = ["iteration " + trace.iteration, count(tokens(trace.stats)) + " tokens"];
  const rest = ["last tool " + tool];
  if (trace.model) rest.push("model " + trace.model);
  const reason = trace.stop_reason || (trace.run && trace.run.stop_reason);
  if (reason) rest.push("reason " + reason);
  const box = node.querySelector(".node-facts");
  box.replaceChildren(facts.join(" · ") + " · ", money(trace.stats.cost_usd, tokens(trace.stats)),
    " · " + rest.join(" · "));
}

export function setDetail(detail) {
  const run = detail.trace.run || {};
  const trace = Object.assign({}, detail.trace, { stop_reason: run.stop_reason });
  setTrace(trace);
  tree.models.set(trace.trace_id, detail.models || {});
  if (detail.budget !== undefined) tree.budget = detail.budget;
  tree.collaborators.set(trace.trace_id, detail.collaborators);
  const node = nodeFor(trace.trace_id);
  const list = node.querySelector(":scope > .collaborators");
  list.replaceChildren(...detail.collaborators.map((c) => {
    const item = el("li", "collaborator", c.name + " [" + c.type + ", " + c.status + "]: " + c.summary);
    item.dataset.traceId = c.trace_id;
    item.dataset.type = c.type;
    if (c.output) item.append(fields(c.output));
    return item;
  }));
  for (const child of detail.children) if (!tree.traces.has(child.trace_id)) setTrace(child);
}

// Tokens and cost of each subtree, children before parents (ids sort parents first).
export function rollups() {
  const totals = new Map();
  const ids = Array.from(tree.traces.keys()).sort().reverse();
  for (const id of ids) {
    const trace = tree.traces.get(id);
    const own = totals.get(id) || { tokens: 0, usd: 0, traces: 0 };
    own.tokens += tokens(trace.stats);
    own.usd += Number(trace.stats.cost_usd || 0);
    own.traces += 1;
    totals.set(id, own);
    const parent = trace.parent_trace_id;
    if (parent) {
      const up = totals.get(parent) || { tokens: 0, usd: 0, traces: 0 };
      up.tokens += own.tokens; up.usd += own.usd; up.traces += own.traces;
      totals.set(parent, up);
    }
  }
  return totals;
}

export function renderRollups(root) {
  const totals = rollups();
  for (const [id, total] of totals) {
    const node = nodeFor(id);
    if (!node) continue;
    const box = node.querySelector(".node-rollup");
    if (total.traces > 1) {
      box.replaceChildren("subtree: " + total.traces + " traces · " + count(total.tokens) + " tokens · ",
        money(total.usd, total.tokens));
    } else box.replaceChildren();
  }
  renderSummary(root, totals.get(root));
}

function renderSummary(root, total) {
  const rootTrace = tree.traces.get(root);
  if (!rootTrace || !total) return;
  const models = new Map();
  for (const counts of tree.models.values()) {
    for (const [model, turns] of Object.entries(counts)) models.set(model, (models.get(model) || 0) + turns);
  }
  const failed = Array.from(tree.traces.values())
    .filter((t) => t.trace_id !== root && t.status === "failed").length;
  const status = rootTrace.status + (failed && TERMINAL.has(rootTrace.status)
    ? " with " + failed + " failed " + (failed === 1 ? "child" : "children") : "");
  const parts = [status, total.traces + " traces", count(total.tokens) + " tokens"];
  $("tree-totals").replaceChildren("tree: " + parts.join(" · ") + " · ", money(total.usd, total.tokens));
  $("stop").hidden = TERMINAL.has(rootTrace.status); // "Stop tree" only while it runs
  $("tree-models").textContent = models.size
    ? "models answered: " + Array.from(models, ([m, n]) => m + " ×" + n).join(", ")
    : "";
  renderBudget(tree.budget);
}

function renderBudget(budget) {
  const box = $("tree-budget");
  box.hidden = !budget;
  if (!budget) return;
  const limit = budget.limit;
  const lines = [];
  if (limit.tokens !== null && limit.tokens !== undefined) {
    lines.push(["tokens", budget.used.tokens, budget.reserved.tokens, limit.tokens]);
  }
  if (limit.usd !== null && limit.usd !== undefined) {
    lines.push(["usd", budget.used.usd, budget.reserved.usd, limit.usd]);
  }
  box.replaceChildren(el("span", "budget-title", "budget"));
  for (const [unit, used, reserved, max] of lines) {
    const item = el("span", "budget-line");
    item.dataset.unit = unit;
    const shown = unit === "usd" ? usd : count;
    item.append(el("span", null, unit + ": used " + shown(used) + " · reserved " + shown(reserved)
      + " · limit " + shown(max)));
    const meter = el("meter");
    meter.min = 0; meter.max = max; meter.value = Math.min(max, used + reserved);
    meter.title = unit + " used + reserved of the limit";
    item.append(meter);
    box.append(item);
  }
  if (budget.exhausted) box.append(el("span", "budget-exhausted", "exhausted: " + budget.exhausted));
}
