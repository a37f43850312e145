// What a person can do to the open trace: stop its subtree, send it a message (read before
// its next model call, or "send now" to cut the call in flight), reply to its question,
// approve or deny its waiting tool call, continue a finished root. Each is one POST with the CSRF
// token; the fleet refuses a second answer to the same question (409), shown as an error.
"use strict";

import { $, button, el, post, showError, traceUrl } from "./util.js";

const TERMINAL = new Set(["completed", "failed", "stopped"]);
const WAITING_KEY = "waiting_on";

export function renderActions(detail, refresh) {
  const trace = detail.trace;
  const box = $("trace-actions");
  // The fleet's own state of the run (its `run`), never the caller's metadata.
  const waiting = trace.status === "waiting" && trace.run ? trace.run[WAITING_KEY] : null;
  // Rebuilt only when what can be done changes: a refresh must not eat what is being typed.
  const key = [trace.trace_id, trace.status, waiting ? waiting.tool_call_id : ""].join(" ");
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const parts = [];
  const act = (action, body, done) => async () => {
    try {
      await post(traceUrl(trace.trace_id, "/" + action), body());
      note(done);
      refresh();
    } catch (error) {
      note("");
      showError(action + ": " + error.message);
    }
  };
  if (!TERMINAL.has(trace.status)) {
    parts.push(button("Stop subtree", act("stop", () => ({}), "stop sent"), "danger"));
    parts.push(messageForm(act));
  }
  if (waiting && waiting.kind === "approval") parts.push(approvalForm(waiting, act));
  else if (waiting) parts.push(replyForm(waiting, act));
  if (!trace.parent_trace_id && TERMINAL.has(trace.status)) parts.push(continueForm(act));
  parts.push(el("span", "action-note"));
  box.replaceChildren(...parts);
}

function note(text) {
  const box = document.querySelector("#trace-actions .action-note");
  if (box) box.textContent = text;
}

function messageForm(act) {
  const form = el("div", "action-form");
  form.id = "message-form";
  const input = el("textarea");
  input.id = "message-input";
  input.rows = 2;
  input.setAttribute("aria-label", "message to the running agent");
  const body = (interrupt) => () => ({ content: input.value, from: "page", interrupt });
  form.append(el("div", "question", "message the agent (read before its next model call)"), input);
  form.append(button("Send message", act("messages", body(false), "message sent")));
  form.append(button("Send now", act("messages", body(true), "sent: its call is cut")));
  return form;
}

function replyForm(waiting, act) {
  const form = el("div", "action-form");
  form.id = "reply-form";
  const input = el("textarea");
  input.id = "reply-input";
  input.rows = 3;
  input.setAttribute("aria-label", "your answer");
  form.append(el("div", "question", "asks: " + (waiting.question || "")), input);
  form.append(button("Send reply", act("reply", () => ({ answer: input.value }), "reply sent")));
  return form;
}

function approvalForm(waiting, act) {
  const form = el("div", "action-form");
  form.id = "approval-form";
  // The call as the fleet shows it: every acted-on argument in full, "… N more characters"
  // for whatever is cut, control characters escaped; the answer carries its digest.
  const shown = waiting.shown || JSON.stringify(waiting.arguments, null, 2);
  form.append(el("div", "question", "wants to run " + waiting.tool), el("pre", "arguments", shown));
  form.append(el("div", "digest", "digest " + (waiting.digest || "")));
  const id = waiting.tool_call_id;
  const digest = waiting.digest;
  const reason = el("input");
  reason.id = "deny-reason";
  reason.placeholder = "reason to deny (required)";
  reason.setAttribute("aria-label", "reason to deny");
  form.append(button("Approve", act("approve", () => ({ approval_id: id, digest }), "approved")));
  form.append(reason, button("Deny", act("deny", () => ({ approval_id: id, digest, reason: reason.value }), "denied"), "danger"));
  return form;
}

function continueForm(act) {
  const form = el("div", "action-form");
  form.id = "continue-form";
  const input = el("textarea");
  input.id = "continue-input";
  input.rows = 2;
  input.setAttribute("aria-label", "new message");
  const after = el("input");
  after.id = "continue-after";
  after.type = "number";
  after.min = "0";
  after.placeholder = "after message # (rewind)";
  after.setAttribute("aria-label", "rewind to after this message number");
  const body = () => {
    const out = { message: input.value };
    if (after.value !== "") out.after_sequence = Number(after.value);
    return out;
  };
  form.append(el("div", "question", "continue this conversation"), input, after);
  form.append(button("Continue", act("continue", body, "continued")));
  return form;
}
