"""Model calls run on spare threads: one kept for the next call, never one still busy."""

from __future__ import annotations

import threading

from fleet.loop.cut import SpareThreads


def ran_on(spare: SpareThreads, work: threading.Event | None = None) -> threading.Thread:
    """The thread `spare` ran a call on (the call blocks until `work` is set, if given)."""
    found: list[threading.Thread] = []
    started = threading.Event()

    def call() -> None:
        found.append(threading.current_thread())
        started.set()
        if work is not None:
            assert work.wait(10)

    spare.run(call)
    assert started.wait(10)
    return found[0]


def test_an_ended_calls_thread_runs_the_next() -> None:
    spare = SpareThreads()
    first = ran_on(spare)
    for _ in range(100):  # it becomes idle just after its call returned
        if spare._idle:
            break
        threading.Event().wait(0.01)
    assert ran_on(spare) is first


def test_a_call_still_running_keeps_its_thread_and_the_next_gets_another() -> None:
    spare = SpareThreads()
    hung = threading.Event()
    busy = ran_on(spare, hung)  # a cut call: it runs on, abandoned
    other = ran_on(spare)
    assert other is not busy
    hung.set()


def test_an_idle_thread_ends() -> None:
    spare = SpareThreads()
    spare.IDLE_S = 0.05
    thread = ran_on(spare)
    thread.join(10)
    assert not thread.is_alive() and spare._idle == []
