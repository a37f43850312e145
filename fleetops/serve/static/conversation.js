// The conversation of one trace: system prompt (collapsed), user turns, assistant text, each
// tool call with its arguments and result (long ones collapsed with their size), injected
// blocks marked, structured outputs as fields; a rewound conversation's branches selectable.
"use strict";

import { renderMarkdown } from "./md.js";
import { $, clock, count, duration, el, fields, money, size } from "./util.js";

const LONG_CHARS = 1500;

// The path from the root to `leaf`, oldest first.
export function pathTo(messages, leaf) {
  const bySequence = new Map(messages.map((m) => [m.sequence, m]));
  const path = [];
  const seen = new Set();
  let current = bySequence.get(leaf);
  while (current && !seen.has(current.sequence)) {
    seen.add(current.sequence);
    path.push(current);
    current = current.parent_sequence === null ? null : bySequence.get(current.parent_sequence);
  }
  return path.reverse();
}

const shown = { trace: null, leaf: null, body: null, detail: null };

// Render the trace's conversation; the branch chosen earlier for the same trace stays.
export function renderConversation(body, detail) {
  const id = detail.trace.trace_id;
  if (shown.trace !== id) { shown.trace = id; shown.leaf = null; }
  shown.body = body;
  shown.detail = detail;
  draw();
}

function draw() {
  const { body, detail } = shown;
  const branches = body.branches || [];
  renderBranches(branches, shown.trace, shown.leaf);
  const known = branches.some((b) => b.leaf_sequence === shown.leaf);
  const head = known ? shown.leaf : mainLeaf(body, branches);
  const path = head === null || head === undefined ? body.messages : pathTo(body.messages, head);
  const results = new Map();
  for (const m of path) if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
  const items = [];
  for (const message of path) {
    if (message.role === "tool" && message.tool_call_id && answered(path, message)) continue;
    items.push(renderMessage(message, results));
  }
  $("message-list").replaceChildren(...items);
  renderOutput(detail);
}

function mainLeaf(body, branches) {
  const main = branches.find((b) => b.main);
  if (main) return main.leaf_sequence;
  return body.head_sequence;
}

function answered(path, tool) {
  return path.some((m) => (m.tool_calls || []).some((c) => c.id === tool.tool_call_id));
}

function renderBranches(branches, traceId, leaf) {
  const box = $("branches");
  box.hidden = branches.length < 2;
  if (branches.length < 2) return;
  // Rebuilt only when the branches change: a live refresh must not close an open select.
  const key = traceId + " " + branches.map((b) => b.leaf_sequence + (b.main ? "*" : "")).join(",");
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const select = el("select");
  select.id = "branch-select";
  select.setAttribute("aria-label", "conversation branch");
  for (const branch of branches) {
    const turns = branch.user_turns.map((t) => contentText(t.content)).filter(Boolean);
    const text = (branch.main ? "main · " : "rewound · ") + "#" + branch.leaf_sequence + " · "
      + (turns[turns.length - 1] || "").slice(0, 60);
    const option = el("option", null, text);
    option.value = String(branch.leaf_sequence);
    option.selected = leaf === null ? branch.main : branch.leaf_sequence === leaf;
    select.append(option);
  }
  select.addEventListener("change", () => { shown.leaf = Number(select.value); draw(); });
  box.replaceChildren(el("label", null, "branch "), select);
}

function renderMessage(message, results) {
  const item = el("li", "message");
  item.dataset.role = message.role;
  item.dataset.sequence = String(message.sequence);
  const meta = message.metadata || {};
  const label = [message.role + (message.name ? " · " + message.name : ""), "#" + message.sequence];
  if (message.model) label.push(message.model);
  if (meta.injected) { item.classList.add("injected"); label.push(injectedKind(message.content)); }
  if (meta.correction) label.push("correction");
  item.append(el("div", "role", label.join(" · ")));
  if (message.role === "assistant") item.append(modelSpan(message));
  const content = contentText(message.content);
  if (message.role === "system") item.append(collapsed("system prompt", content || ""));
  else if (content && message.role === "assistant") item.append(renderMarkdown(content, "content"));
  else if (content) item.append(textBlock("content", content));
  if (message.long_term_memory) item.append(textBlock("memory", "kept in memory: " + message.long_term_memory));
  if (meta.delivered) item.append(delivered(meta.delivered));
  for (const call of message.tool_calls || []) item.append(renderCall(call, results.get(call.id)));
  return item;
}

// A message's content is text, or parts: text, and images stored by reference (never bytes).
export function contentText(content) {
  if (!Array.isArray(content)) return content;
  return content.map((part) => {
    if (part.type === "text") return part.text || "";
    const ref = part.image_ref || {};
    const kind = String(ref.media_type || "image/?").replace("image/", "").toUpperCase();
    const kb = (Number(ref.bytes) || 0) / 1000;
    return "[image " + kind + " " + ref.width + "x" + ref.height + ", " + kb.toFixed(1) + " KB]";
  }).join("\n");
}

// Messages that reached the conversation (a `## Messages` block in full, check_messages),
// each with its sender: shown as text, never as markup.
function delivered(entries) {
  const list = el("ul", "delivered");
  for (const entry of entries) {
    list.append(el("li", null, "from " + entry.from + ": " + entry.content));
  }
  return list;
}

function injectedKind(content) {
  const text = contentText(content) || "";
  if (text.includes("## Messages")) return "injected: messages";
  if (text.includes("Active Collaborators")) return "injected: collaborators";
  if (/plan|goal/i.test(text.slice(0, 200))) return "injected: plan";
  return "injected";
}

function renderCall(call, result) {
  const fn = call.function || {};
  const box = el("div", "tool-call");
  box.dataset.tool = fn.name || "";
  box.append(el("div", "call-name", "→ " + fn.name));
  box.append(textBlock("arguments", prettyJson(fn.arguments)));
  if (!result) {
    box.append(el("div", "pending", "no result yet"));
    return box;
  }
  const meta = result.metadata || {};
  if (meta.started_at_ms) {
    box.append(span("tool", "tool call", meta.started_at_ms, result.created_at_ms, meta.is_error ? "error" : ""));
  }
  const res = el("div", "tool-result");
  if (meta.is_error) res.classList.add("error");
  const text = contentText(result.content) || "";
  res.append(text.length > LONG_CHARS ? collapsed("result", text) : textBlock("result", text));
  if (result.long_term_memory) {
    res.append(textBlock("memory", "kept in memory (full text elided): " + result.long_term_memory));
  }
  if (meta.delivered) res.append(delivered(meta.delivered));
  box.append(res);
  return box;
}

function prettyJson(raw) {
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch (error) {
    return String(raw === undefined ? "" : raw);
  }
}

function textBlock(className, text) {
  return el("pre", className, text);
}

function collapsed(title, text) {
  const box = el("details", "collapsed");
  box.append(el("summary", null, title + " (" + size(text.length) + ")"), textBlock("content", text));
  return box;
}

function renderOutput(detail) {
  const box = $("trace-output");
  const trace = detail.trace;
  const parts = [];
  if (trace.output) parts.push(el("h3", null, "structured output"), fields(trace.output));
  for (const c of detail.collaborators) {
    if (c.output) parts.push(el("h3", null, c.name + " (" + c.type + ") output"), fields(c.output));
  }
  if (trace.error) parts.push(el("h3", null, "error"), textBlock("error", trace.error));
  if (trace.answer) parts.push(el("h3", null, "answer"), renderMarkdown(trace.answer, "answer"));
  box.replaceChildren(...parts);
}

// A call as a timed span: what, how long, from when to when, and what it cost.
function span(kind, what, start, end, extra) {
  const line = el("div", "call-span");
  line.dataset.kind = kind;
  line.dataset.durationMs = String(end - start);
  line.append(el("span", "span-what", what), el("span", "span-duration", duration(end - start)),
    el("span", "span-when", clock(start) + " → " + clock(end)));
  if (extra) line.append(el("span", "span-extra", extra));
  return line;
}

// An assistant turn's model call: its span, tokens, cost and, when retried, every attempt.
function modelSpan(message) {
  const call = (message.metadata || {}).call_span;
  const tokens = (message.prompt_tokens || 0) + (message.completion_tokens || 0);
  const facts = count(message.prompt_tokens) + "+" + count(message.completion_tokens) + " tokens";
  if (!call) {
    const line = el("div", "call-span", "model call · " + facts + " · ");
    line.append(money(message.cost_usd, tokens));
    return line;
  }
  const attempts = call.attempts || [];
  const line = span("model", "model call", call.started_at_ms, call.ended_at_ms,
    facts + (attempts.length > 1 ? " · attempt " + attempts.length + " of " + attempts.length : ""));
  line.append(money(message.cost_usd, tokens));
  if (attempts.length < 2) return line;
  const box = el("div", "call");
  const list = el("ol", "attempts");
  for (const attempt of attempts) {
    const item = el("li", attempt.error ? "attempt failed" : "attempt",
      duration(attempt.ended_at_ms - attempt.started_at_ms) + " · " + clock(attempt.started_at_ms)
      + " · " + (attempt.error || "answered"));
    list.append(item);
  }
  box.append(line, list);
  return box;
}
