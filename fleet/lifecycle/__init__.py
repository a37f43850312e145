"""Every status change of a trace, and the one writer of collaborator entries.

A trace goes `queued -> running -> (waiting -> running)* -> completed|failed|stopped`; a
new root is created `queued` with its event (`queue_root`; a new child is told by its
parent's entry, `announce`), a yielded run goes back to `queued`, a reopened child
(`continue_from`) from terminal to `queued`. Only this package writes `status`
(`status`), and only it writes a parent's collaborator entries (`entries`), so a new
transition (a budget stop, a wait on a person) is added here, once, for the runner, both
dispatchers and the Celery tasks alike. Callers use the names below (`lifecycle.finish`,
...); it imports the runtime and the storage roles, never the loop, children or
conversation.
"""

from fleet.lifecycle.batch import BATCH_ENTRY, batch_answered, put_batch, wait_on_batch
from fleet.lifecycle.entries import announce, mirrored, put_collaborator
from fleet.lifecycle.remote import (
    RemoteCall,
    call_of,
    remote_ended,
    remote_progress,
    wait_on_remote,
)
from fleet.lifecycle.status import (
    PERSON_SUMMARY_CHARS,
    end_stopped,
    fail,
    finish,
    human_id,
    person_answered,
    put_person,
    queue_root,
    reopen,
    reopen_root,
    requeue,
    start,
    starting,
    stop_for_budget,
    stop_subtree,
    wait,
    wait_in,
    wait_on_person,
)

__all__ = [
    "BATCH_ENTRY",
    "PERSON_SUMMARY_CHARS",
    "RemoteCall",
    "announce",
    "call_of",
    "batch_answered",
    "end_stopped",
    "fail",
    "finish",
    "human_id",
    "mirrored",
    "person_answered",
    "put_batch",
    "put_collaborator",
    "put_person",
    "queue_root",
    "remote_ended",
    "remote_progress",
    "reopen",
    "reopen_root",
    "requeue",
    "start",
    "starting",
    "stop_for_budget",
    "stop_subtree",
    "wait",
    "wait_in",
    "wait_on_batch",
    "wait_on_person",
    "wait_on_remote",
]
