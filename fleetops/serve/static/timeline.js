// The timeline: one row per trace, segments folded from the tree's event stream (queued,
// running, waiting on children / a limit / a person / an approval), model and tool calls
// as timed spans (start to end, tokens, cost, attempts; a tick for an event that predates
// spans), rows in spawn order (parents first, children as they were created). Rows are virtualised: only those in view are in the DOM, so 1,000 branches
// cost what 40 do.
"use strict";

import { $, clock, count, duration, el, usd } from "./util.js";

const ROW_PX = 22;
const OVERSCAN = 10;
const LABELS = {
  queued: "queued",
  running: "running",
  children: "waiting on sub-agents",
  limit: "waiting on a limit / countdown",
  person: "waiting on a person",
  approval: "waiting on an approval",
  batch: "waiting on a provider batch",
  unknown: "no events (stream trimmed)",
};

const WAITING_ON = { human: "person", batch: "batch" }; // a `waiting` event's data.on

export const timeline = {
  rows: new Map(),  // trace id -> {id, name, segments: [{kind, start, end, note}], ticks: [], end}
  order: [],        // trace ids, parents first
  t0: null,
  t1: null,
  drawMs: 0,        // the last draw's duration (the page's render cost)
  draws: 0,
  onOpen: null,
  scheduled: false,
};

function rowFor(id) {
  let row = timeline.rows.get(id);
  if (!row) {
    row = { id, name: id, segments: [], ticks: [], calls: [], end: null, status: null };
    timeline.rows.set(id, row);
    timeline.order = null; // re-sorted at the next draw
  }
  return row;
}

function open(row, kind, at, note) {
  const last = row.segments[row.segments.length - 1];
  if (last && last.end === null) {
    if (last.kind === kind) return;
    last.end = at;
  }
  row.segments.push({ kind, start: at, end: null, note: note || "" });
  stretch(at);
}

function closeAll(row, at) {
  const last = row.segments[row.segments.length - 1];
  if (last && last.end === null) last.end = at;
  row.end = at;
  stretch(at);
}

function stretch(at) {
  if (timeline.t0 === null || at < timeline.t0) timeline.t0 = at;
  if (timeline.t1 === null || at > timeline.t1) timeline.t1 = at;
}

function queuedKind(data) {
  const on = data.on || "";
  const answered = ["", "yield", "human", "batch"]; // handed back to run: plain queued
  if (answered.includes(on) || data.turn !== undefined) return ["queued", on];
  return ["limit", on + (data.retry_in_s ? " (again in " + data.retry_in_s + " s)" : "")];
}

// One event of the stream into the rows.
export function fold(event) {
  const at = event.at_ms;
  const data = event.data || {};
  const row = rowFor(event.trace_id);
  if (row.firstAt === undefined) row.firstAt = at; // its spawn time until the listing says
  switch (event.kind) {
    case "collaborator":
      if (data.type === "human" || data.type === "approval") {
        if (event.status === "waiting") open(row, data.type === "approval" ? "approval" : "person", at, data.question);
      } else if (event.status === "queued") {
        if (data.name) row.name = data.name;
        if (!row.segments.length) open(row, "queued", at);
      }
      break;
    case "trace":
      if (event.status === "running") open(row, "running", at);
      else if (event.status === "waiting") open(row, WAITING_ON[data.on] || "children", at);
      else if (event.status === "queued") {
        const [kind, note] = queuedKind(data);
        open(row, kind, at, note);
        row.end = null;
        failedAttempts(row, data.attempts || []);
      }
      break;
    case "message":
      if (data.started_at_ms && (data.role === "assistant" || data.tool)) {
        row.calls.push(callOf(data, at));
        stretch(data.started_at_ms);
      } else if (data.role === "assistant") row.ticks.push({ kind: "model", at, note: (data.tools || []).join(", ") });
      else if (data.role === "tool" && data.tool) row.ticks.push({ kind: "tool", at, note: data.tool });
      stretch(at);
      break;
    case "finish":
      row.status = event.status;
      closeAll(row, at);
      break;
    default:
      break;
  }
  schedule();
}

// A model or tool call as a span: from its start to its message (the event's time).
function callOf(data, at) {
  if (data.role === "assistant") {
    const tokens = (data.prompt_tokens || 0) + (data.completion_tokens || 0);
    const cost = tokens && !data.cost_usd ? "unpriced" : usd(data.cost_usd);
    const tries = data.attempts > 1 ? " · attempt " + data.attempts + " of " + data.attempts : "";
    const note = count(data.prompt_tokens) + "+" + count(data.completion_tokens) + " tokens · " + cost + tries
      + ((data.tools || []).length ? " → " + data.tools.join(", ") : "");
    return { kind: "model", start: data.started_at_ms, end: at, what: "model call", note, attempts: data.attempts || 1 };
  }
  return { kind: data.is_error ? "tool-error" : "tool", start: data.started_at_ms, end: at, what: "tool " + data.tool, note: "" };
}

// The attempts of a model call that failed (a provider error handed the run back).
function failedAttempts(row, attempts) {
  attempts.forEach((attempt, index) => {
    row.calls.push({
      kind: "attempt-failed", start: attempt.started_at_ms, end: attempt.ended_at_ms, what: "failed model call",
      note: "attempt " + (index + 1) + " of " + attempts.length + " · " + (attempt.error || "failed"),
    });
    stretch(attempt.started_at_ms);
  });
}

// What the listing knows of a trace: its name, and its life when the stream lost its events.
export function seed(trace) {
  const row = rowFor(trace.trace_id);
  row.name = trace.name || trace.mode || row.name;
  if (row.parent !== trace.parent_trace_id || row.created !== trace.created_at_ms) timeline.order = null;
  row.parent = trace.parent_trace_id;
  row.status = trace.status;
  row.created = trace.created_at_ms;
  if (trace.finished_at_ms) row.finished = trace.finished_at_ms;
  stretch(trace.created_at_ms);
  if (trace.finished_at_ms) stretch(trace.finished_at_ms);
  schedule();
}

export function schedule() {
  if (timeline.scheduled || $("timeline").hidden) return;
  timeline.scheduled = true;
  requestAnimationFrame(() => { timeline.scheduled = false; draw(); });
}

function live() {
  for (const row of timeline.rows.values()) if (row.end === null && !row.finished) return true;
  return false;
}

export function draw() {
  const started = performance.now();
  if (timeline.order === null || timeline.order.length !== timeline.rows.size) timeline.order = spawnOrder();
  const t0 = timeline.t0 === null ? Date.now() : timeline.t0;
  const t1 = Math.max(live() ? Date.now() : (timeline.t1 || t0), t0 + 1);
  const box = $("timeline-rows");
  box.style.height = timeline.order.length * ROW_PX + "px";
  const view = $("timeline-scroll");
  const first = Math.max(0, Math.floor(view.scrollTop / ROW_PX) - OVERSCAN);
  const last = Math.min(timeline.order.length, Math.ceil((view.scrollTop + view.clientHeight) / ROW_PX) + OVERSCAN);
  const shown = [];
  for (let i = first; i < last; i += 1) shown.push(drawRow(timeline.rows.get(timeline.order[i]), i, t0, t1));
  const active = document.activeElement;
  const focused = active && active.classList.contains("tl-label") ? active.parentElement.dataset.traceId : null;
  box.replaceChildren(...shown);
  if (focused) { // a live redraw must not take the keyboard's place away
    const again = box.querySelector('.tl-row[data-trace-id="' + CSS.escape(focused) + '"] .tl-label');
    if (again) again.focus({ preventScroll: true });
  }
  $("timeline-axis").textContent = clock(t0) + " → " + clock(t1) + " (" + duration(t1 - t0) + ") · "
    + timeline.order.length + " rows";
  timeline.drawMs = performance.now() - started;
  timeline.draws += 1;
}

function drawRow(row, index, t0, t1) {
  const line = el("div", "tl-row");
  line.style.top = index * ROW_PX + "px";
  line.dataset.traceId = row.id;
  const label = el("button", "tl-label", row.name);
  label.type = "button";
  label.title = row.id;
  label.addEventListener("click", () => timeline.onOpen(row.id));
  const bar = el("div", "tl-bar");
  const span = t1 - t0;
  const segments = row.segments.length ? row.segments : fallback(row);
  for (const seg of segments) {
    const end = seg.end === null ? (row.end || t1) : seg.end;
    const part = el("div", "tl-seg");
    part.dataset.kind = seg.kind;
    part.style.left = ((seg.start - t0) / span) * 100 + "%";
    part.style.width = Math.max(0.2, ((end - seg.start) / span) * 100) + "%";
    part.dataset.hover = LABELS[seg.kind] + " " + duration(end - seg.start) + " (" + clock(seg.start)
      + " → " + (seg.end === null && !row.end ? "now" : clock(end)) + ")" + (seg.note ? " · " + seg.note : "");
    part.title = part.dataset.hover;
    bar.append(part);
  }
  for (const call of row.calls) {
    const part = el("div", "tl-call");
    part.dataset.kind = call.kind;
    part.dataset.durationMs = String(call.end - call.start);
    part.style.left = ((call.start - t0) / span) * 100 + "%";
    part.style.width = Math.max(0.3, ((call.end - call.start) / span) * 100) + "%";
    part.dataset.hover = call.what + " " + duration(call.end - call.start) + " (" + clock(call.start) + " → "
      + clock(call.end) + ")" + (call.note ? " · " + call.note : "");
    part.title = part.dataset.hover;
    bar.append(part);
  }
  for (const tick of row.ticks) {
    const mark = el("div", "tl-tick");
    mark.dataset.kind = tick.kind;
    mark.style.left = ((tick.at - t0) / span) * 100 + "%";
    mark.title = (tick.kind === "model" ? "model call" : "tool " + tick.note) + " at " + clock(tick.at)
      + (tick.kind === "model" && tick.note ? " → " + tick.note : "");
    mark.dataset.hover = mark.title;
    bar.append(mark);
  }
  line.append(label, bar);
  return line;
}

// Parents first, each one's children in the order they were spawned (created, then id).
function spawnOrder() {
  const kids = new Map();
  const tops = [];
  for (const row of timeline.rows.values()) {
    const parent = row.parent && timeline.rows.has(row.parent) ? row.parent : null;
    if (parent === null) tops.push(row);
    else { if (!kids.has(parent)) kids.set(parent, []); kids.get(parent).push(row); }
  }
  const order = [];
  const when = (row) => row.created || row.firstAt || 0;
  const bySpawn = (a, b) => when(a) - when(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  const walk = (rows) => {
    for (const row of rows.sort(bySpawn)) { order.push(row.id); walk(kids.get(row.id) || []); }
  };
  walk(tops);
  return order;
}

function fallback(row) {
  if (!row.created) return [];
  return [{ kind: "unknown", start: row.created, end: row.finished || null, note: "" }];
}

export function startTimeline() {
  const view = $("timeline-scroll");
  view.addEventListener("scroll", schedule);
  view.addEventListener("mouseover", (event) => {
    const hover = event.target.dataset && event.target.dataset.hover;
    if (hover) $("timeline-hover").textContent = hover;
  });
  view.addEventListener("focusin", (event) => { // the keyboard's hover: the row's segments
    if (!event.target.classList.contains("tl-label")) return;
    const parts = event.target.parentElement.querySelectorAll(".tl-seg, .tl-call");
    $("timeline-hover").textContent = event.target.textContent + ": "
      + Array.from(parts, (part) => part.dataset.hover).join(" | ");
  });
  setInterval(() => { if (live()) schedule(); }, 1000);
}
