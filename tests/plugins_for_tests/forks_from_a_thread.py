"""Forks a child process from a thread of its own half a second after it is imported, as OpenVINO's
telemetry does on import, and writes the child's exit code to ``$FORKS_FROM_A_THREAD`` (``timeout``
when the child has not ended within 20 s); registers no backend, never installed."""

import multiprocessing
import os
import threading
import time


def _child() -> None:
    pass


def _fork_later(report: str) -> None:
    time.sleep(0.5)  # the worker is waiting for its next request by now
    child = multiprocessing.get_context("fork").Process(target=_child, daemon=True)
    child.start()
    child.join(20)
    code = "timeout" if child.exitcode is None else str(child.exitcode)
    if child.exitcode is None:
        child.kill()
    with open(report, "w") as file:
        file.write(code)


if os.environ.get("FORKS_FROM_A_THREAD"):
    threading.Thread(target=_fork_later, args=(os.environ["FORKS_FROM_A_THREAD"],), daemon=True).start()
