// The Plan view of the open trace: its goals (status; abandoned and rewound ones greyed),
// the messages written while each was in focus, the sub-agents each spawned, and the
// branches a rewind left behind. Each goal folds (<details>); the view is drawn again on
// every refresh of the open trace, so it is live. Text goes in as text, never as HTML.
import { $, api, el, traceUrl } from "./util.js";

const folded = new Set();  // goal ids a person folded: kept folded across live redraws

export async function renderPlan(id, stillOpen) {
  let dag;
  try {
    dag = await api(traceUrl(id, "/dag"));
  } catch (error) {
    $("plan").hidden = true;  // a service without the control API: no plan view
    return;
  }
  if (!stillOpen()) return;
  const body = $("plan-body");
  const byId = new Map(dag.messages.map((m) => [m.sequence, m]));
  const parts = dag.goals.map((goal) => goalView(goal, byId, dag.focus_id));
  if (dag.unplanned.length) parts.push(messageGroup("before any goal", dag.unplanned, byId));
  const rewound = dag.branches.filter((b) => !b.main && b.messages.length);
  for (const branch of rewound) parts.push(branchView(branch, byId));
  body.replaceChildren(...parts);
  $("plan").hidden = !dag.goals.length && !rewound.length;
  $("plan").dataset.goals = String(dag.goals.length);
}

function goalView(goal, byId, focusId) {
  const box = el("details", "goal goal-" + goal.status + (goal.greyed ? " greyed" : ""));
  box.dataset.goal = goal.id;
  box.open = !folded.has(goal.id);
  box.addEventListener("toggle", () => {
    if (box.open) folded.delete(goal.id); else folded.add(goal.id);
  });
  const head = el("summary", "goal-head");
  head.append(
    el("span", "goal-id", goal.id),
    el("span", "goal-status", goal.rewound ? "rewound" : goal.status),
    el("span", "goal-text", goal.description + (goal.id === focusId ? " (focus)" : "")),
  );
  box.append(head);
  if (goal.summary) box.append(el("p", "goal-summary", goal.summary));
  box.append(messageList(goal.messages, byId));
  if (goal.sub_agents.length) {
    const agents = el("ul", "goal-agents");
    for (const traceId of goal.sub_agents) agents.append(el("li", "goal-agent", traceId));
    box.append(agents);
  }
  return box;
}

function messageGroup(title, sequences, byId) {
  const box = el("details", "goal unplanned");
  box.open = false;
  box.append(el("summary", "goal-head", title), messageList(sequences, byId));
  return box;
}

function branchView(branch, byId) {
  const box = el("details", "goal greyed branch-rewound");
  box.dataset.fork = String(branch.fork_sequence);
  box.append(
    el("summary", "goal-head", "rewound branch after message " + branch.fork_sequence),
    messageList(branch.messages, byId),
  );
  return box;
}

function messageList(sequences, byId) {
  const list = el("ol", "plan-messages");
  for (const sequence of sequences) {
    const message = byId.get(sequence);
    if (!message) continue;
    const item = el("li", "plan-message" + (message.main ? "" : " off-path"));
    item.dataset.sequence = String(sequence);
    item.append(
      el("span", "plan-seq", "#" + sequence),
      el("span", "plan-role", message.role),
      el("span", "plan-label", message.label),
    );
    list.append(item);
  }
  return list;
}
