"""The in-process `Dispatcher` (its Protocol lives in `fleet.runtime`): children in threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fleet import lifecycle
from fleet.runner import Runner, run_to_end
from fleet.runtime import Runtime, SpawnRequest


class InProcessDispatcher:
    """Runs children in this process: explore branches concurrently in threads."""

    children_survive_restart = False

    def __init__(self, max_parallel: int = 16) -> None:
        """`max_parallel` caps the threads of one explore."""
        self.max_parallel = max_parallel

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Run every child to its end, then collect them into the parent."""
        runner = Runner(runtime)
        ids = list(request.child_ids)
        if len(ids) == 1:
            run_to_end(runner, ids[0])
        else:
            with ThreadPoolExecutor(min(len(ids), self.max_parallel), "fleet-branch") as pool:
                list(pool.map(lambda child: run_to_end(runner, child), ids))
        # Every child ran to its end here, so this settles the call (a child whose runner
        # lost its lease leaves it `Waiting`: nothing of it would be true yet).
        lifecycle.settle(runtime, request.parent_trace_id, request.tool_call_id, ids)
