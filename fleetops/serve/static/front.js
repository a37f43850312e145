// The front page: recent trees (or traces waiting on a person), filtered, paged by cursor.
"use strict";

import { $, api, count, cut, duration, el, money, pageUrl, showError, tokens } from "./util.js";

const TERMINAL = new Set(["completed", "failed", "stopped"]);

const FILTERS = ["status", "waiting", "model", "preset", "q"];
const PAGE_SIZE = 50;
const paging = { cursors: [""], index: 0, next: null, loads: 0 };

export function startFront() {
  $("front").hidden = false;
  const params = new URLSearchParams(location.search);
  for (const name of FILTERS) $("filter-" + name).value = params.get(name) || "";
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const name of FILTERS) {
      const value = $("filter-" + name).value.trim();
      if (value) next.set(name, value);
    }
    history.replaceState(null, "", "?" + next.toString());
    paging.cursors = [""];
    paging.index = 0;
    load();
  });
  $("page-next").addEventListener("click", () => {
    if (!paging.next) return;
    paging.cursors[paging.index + 1] = paging.next;
    paging.index += 1;
    load();
  });
  $("page-prev").addEventListener("click", () => {
    if (paging.index === 0) return;
    paging.index -= 1;
    load();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "/" && document.activeElement.tagName !== "INPUT") {
      event.preventDefault();
      $("filter-q").focus();
    }
  });
  return load();
}

function query() {
  const params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = $("filter-" + name).value.trim();
    if (value) params.set(name, value);
  }
  // Waiting traces are listed themselves (a branch may wait); otherwise whole trees.
  if (!params.has("waiting")) params.set("roots", "1");
  params.set("limit", String(PAGE_SIZE));
  const cursor = paging.cursors[paging.index];
  if (cursor) params.set("cursor", cursor);
  return params;
}

async function load() {
  const mine = ++paging.loads;
  try {
    const body = await api("/api/traces?" + query().toString());
    if (mine !== paging.loads) return; // a later filter or page asked since: it wins
    paging.next = body.next;
    $("trace-rows").replaceChildren(...body.traces.map(row));
    $("page-next").disabled = !body.next;
    $("page-prev").disabled = paging.index === 0;
    $("page-info").textContent = "page " + (paging.index + 1) + " · " + body.traces.length + " shown";
    $("front").dataset.loaded = String(Date.now());
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

function row(trace) {
  const tr = el("tr");
  tr.dataset.traceId = trace.trace_id;
  tr.dataset.status = trace.status;
  const link = el("a", null, trace.trace_id);
  link.href = pageUrl(trace.root_trace_id, trace.trace_id);
  const stats = trace.tree_stats || trace.stats;
  const end = trace.finished_at_ms || Date.now();
  const failed = trace.failed_branches || 0;
  const status = trace.waiting_on ? "waiting on " + trace.waiting_on : trace.status
    + (failed && TERMINAL.has(trace.status) ? " with " + failed + " failed " + (failed === 1 ? "child" : "children") : "");
  const task = el("span", "task", cut(trace.task, 120));
  task.title = trace.task;
  const error = el("span", "error-cell", trace.error ? cut(trace.error, 100) : "");
  if (trace.error) error.title = trace.error;
  const cells = [
    link,
    el("span", "status", status),
    task,
    error,
    trace.model || "–",
    trace.preset,
    duration(Date.now() - trace.created_at_ms),
    duration(end - trace.created_at_ms),
    trace.branches === undefined ? "–" : trace.branches,
    count(tokens(stats)),
    money(stats.cost_usd, tokens(stats)),
  ];
  for (const cell of cells) {
    const td = el("td");
    if (cell instanceof Node) td.append(cell);
    else td.textContent = String(cell);
    tr.append(td);
  }
  tr.children[0].dataset.col = "id";
  tr.children[3].dataset.col = "error";
  return tr;
}
