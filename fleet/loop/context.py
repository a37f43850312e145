"""What a trace's model sees besides the conversation: first messages and injections."""

from __future__ import annotations

import json
from collections.abc import Sequence

from fleet.conversation.messages import delivered_of, news
from fleet.experiences.retrieval import render, select
from fleet.loop.memory_calls import memory_block
from fleet.loop.structured import VERDICT_SCHEMA, instruction, schema_for
from fleet.models import Content, Message, Role, Trace
from fleet.runtime import Runtime
from fleet.storage.writes import InboxSeen

BASE_PROMPT = (
    "You are an agent working in the workspace {workspace}. Use the tools to inspect and "
    "change it; paths are relative to the workspace. When you are done, answer without "
    "calling a tool: that answer is your result."
)


def first_messages(runtime: Runtime, trace: Trace) -> list[Message]:
    """System prompt, any context messages the parent passed, then the task."""
    preset = runtime.preset(trace.preset)
    workspace = trace.workspace or str(runtime.settings.workspace)
    system = "\n\n".join(
        part
        for part in (
            BASE_PROMPT.format(workspace=workspace),
            preset.system_prompt,
            trace.context.get("system"),  # the submitter's (a prompt file's `$system$`)
        )
        if part
    )
    skills = [*preset.skills, *trace.skills]
    if skills:
        system += "\n\nLoad these skills with the `skill` tool when useful: " + ", ".join(skills)
    if preset.experiences and runtime.experiences is not None:
        shown = select(runtime.experiences, trace, embedder=runtime.embedder)
        if shown:  # counted as used now; `fleet.experiences.outcomes` counts the success
            runtime.experiences.count_use([e.id for e in shown], trace.trace_id)
            system += "\n\n" + render(shown)
    if memory := memory_block(runtime, trace):  # the submitter's namespaces, quoted as data
        system += "\n\n" + memory
    schema = schema_for(preset.output_schema, preset.name, trace)
    if schema is not None and schema is not VERDICT_SCHEMA:  # the judge's prompt has its own
        system += "\n\n" + instruction(schema)
    out = [Message(trace_id=trace.trace_id, role="system", content=system)]
    for item in trace.context.get("messages") or []:
        role: Role = "assistant" if item.get("role") == "assistant" else "user"
        out.append(Message(trace_id=trace.trace_id, role=role, content=item["content"]))
    task = trace.task
    if trace.context.get("extra"):
        task += "\n\nContext:\n" + json.dumps(trace.context["extra"], ensure_ascii=False)
    content: Content = task
    if trace.context.get("images"):  # `image_ref` parts: stored for the tree at submission
        refs = [p for p in trace.context["images"] if p.get("type") == "image_ref"]
        content = [{"type": "text", "text": task}, *refs]
    out.append(Message(trace_id=trace.trace_id, role="user", content=content))
    return out


def injection(
    runtime: Runtime,
    trace: Trace,
    messages: Sequence[Message] = (),
    seen: InboxSeen | None = None,
) -> Message | None:
    """Every N turns, the plan, `## Active Collaborators` and hook lines as a user message.

    And before any call after a message came to the trace's inbox, `## Messages`
    (`fleet.conversation.messages`): the message carries the inbox cursors it moves.
    `seen`: the inbox as the run's last round trip read it (None: `news` reads it).
    """
    every = runtime.settings.inject_every_turns
    blocks: list[str] = []
    if trace.iteration > 0 and every > 0 and trace.iteration % every == 0:
        blocks = [trace.goals.render(), collaborators_block(runtime, trace.trace_id)]
        blocks.append("\n".join(runtime.hooks.context_lines(trace)))  # the operator's hooks
    inbox = news(runtime, trace, messages, seen)
    if inbox is not None:
        blocks.append(inbox.block)
    body = "\n\n".join(b for b in blocks if b)
    if not body:
        return None
    metadata = {"injected": True, **(inbox.metadata if inbox else {})}
    if inbox is not None and inbox.delivered:
        metadata["delivered"] = delivered_of(inbox.delivered)
    return Message(trace_id=trace.trace_id, role="user", content=body, metadata=metadata)


def collaborators_block(runtime: Runtime, trace_id: str) -> str:
    """`## Active Collaborators` with one line per collaborator."""
    # A provider batch holding a model call is no collaborator of the agent's own making.
    entries = [c for c in runtime.store.collaborators(trace_id) if c.type != "batch"]
    if not entries:
        return ""
    lines = ["## Active Collaborators"]
    for c in entries:
        summary = " ".join(c.summary.split())[:160]
        lines.append(f"- {c.name} [{c.type}, {c.status}]: {summary}")
    return "\n".join(lines)
