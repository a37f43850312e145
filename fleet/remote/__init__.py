"""Remote sub-agents over A2A: a child of a tree that is a task of an agent elsewhere.

`agent(task, agent="reviewer")` creates a child of mode `remote` (`spawn`); its run sends
the message through a2a-sdk's client (`wire`) and parks the child `waiting` with no slot
(`run`); every worker's one watcher follows the parked tasks (`poll`, behind the watch
list `fleet.storage.remote_watch`): over SSE where the agent's card says it streams
(`stream`), else with GetTask, and turns what it hears into the child's events, a
question to a person (input-required) or its end, after which a run finishes the child
and settles its parent as any sub-agent's. `decide` is the one pure rule from a remote
task's state to what happens. docs/a2a.md.

Imports: config, tools (the SSRF guard), storage, runtime, lifecycle and conversation
(a wait on a person); nothing that runs a model.
"""
