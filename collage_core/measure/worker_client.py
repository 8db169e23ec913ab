"""The parent's side of a measurement worker: start it, send it work, survive its crashes and hangs.

A worker that dies of SIGKILL or SIGTERM was most likely killed from outside (the kernel's
out-of-memory killer, a user's ``kill``), and one that runs out of time while the machine kept
it waiting for a processor was held up by others: neither says anything about what it ran. Such
a request is sent once more to a fresh worker. Killed a second time, the death is taken as the
request's own (it may need more memory than there is); held up a second time, the failure is
transient (:data:`collage_core.measure.cost_db.TRANSIENT_REASON`), and a later run measures it again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional, Sequence

from collage_core.measure import threads, zygote
from collage_core.measure.cost_db import TRANSIENT_REASON
from collage_core.measure.processor_wait import waited_ns_by_thread

log = logging.getLogger("collage")

# Requests that carry all they need (the rest is in files), so a fresh worker can answer them again.
RETRIED_OPS = frozenset({"measure_candidate", "build_candidate", "time_candidate", "run_placement"})
# What kills a process from outside: the out-of-memory killer and ``kill -9`` send SIGKILL, ``kill``
# and service managers SIGTERM. A fault of what the worker runs shows as SIGSEGV, SIGABRT, SIGBUS, ...
OUTSIDE_SIGNALS = (signal.SIGKILL, signal.SIGTERM)
# A worker that spent this share of a wait that timed out waiting for a processor (runnable, but
# another process ran) was held up by the machine's load. One that hangs by itself sleeps, or runs.
HELD_UP_SHARE = 0.25
# How long a fresh worker may take to load its plugins.
START_TIMEOUT_S = 120.0


class WorkerFailure(Exception):
    """The worker crashed, hung or answered with an error; the message says which and why."""


class TransientFailure(WorkerFailure):
    """The worker failed for no fault of the request: killed by one of OUTSIDE_SIGNALS (named in
    ``signal_name``), or out of time while the machine kept it waiting for a processor."""

    def __init__(self, message: str, signal_name: Optional[str] = None):
        super().__init__(message)
        self.signal_name = signal_name


class StageTooSlow(WorkerFailure):
    """The step after ``stage`` took longer than its limit; the worker was stopped."""

    def __init__(self, stage: str, limit_s: float):
        super().__init__(f"the step after {stage!r} took longer than {limit_s:g} s")
        self.stage = stage
        self.limit_s = limit_s


class MeasurementWorker:
    """A ``python -m collage_core.measure.worker`` process, restarted after any crash or timeout."""

    def __init__(self, plugin_modules: Sequence[str], disabled: Sequence[str], env: Optional[dict] = None):
        self.plugin_modules = list(plugin_modules)
        self.disabled = list(disabled)
        self.env = env
        self.process: Optional[subprocess.Popen] = None
        self.stderr_file = None
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, message: dict, timeout_s: float, stage_limits: Optional[dict] = None) -> dict:
        """Send ``message`` and wait at most ``timeout_s`` for the answer.

        The worker reports finished stages (``{"progress": "built"}``) on the way; ``stage_limits``
        maps a stage to the most seconds the step after it may take, and the worker is stopped
        with :class:`StageTooSlow` when it takes longer.

        A request of RETRIED_OPS that fails transiently is sent once more to a fresh worker (see
        the module's docstring); each such failure is named in a warning, by the request's
        ``what`` where it has one.
        """
        try:
            return self._request_once(message, timeout_s, stage_limits)
        except TransientFailure as failure:
            if message.get("op") not in RETRIED_OPS:
                raise
            first = failure
        log.warning("%s: %s; trying once more in a fresh worker", describe_request(message), first)
        try:
            return self._request_once(message, timeout_s, stage_limits)
        except TransientFailure as again:
            if first.signal_name and again.signal_name:
                raise WorkerFailure(f"{again}, twice in a row: taken as its own doing (out of memory?)") from None
            judged = TransientFailure(f"{TRANSIENT_REASON} ({first}; then {again}): a later run measures it again")
        log.warning("%s: %s", describe_request(message), judged)
        raise judged

    def _request_once(self, message: dict, timeout_s: float, stage_limits: Optional[dict]) -> dict:
        if self.process is None:
            self._start()
        response = self._exchange(message, timeout_s)
        while "progress" in response:
            stage = response["progress"]
            limit = (stage_limits or {}).get(stage)
            try:
                response = self._next(timeout_s if limit is None else limit)
            except WorkerFailure as failure:
                if limit is not None and "timed out" in str(failure):
                    raise StageTooSlow(stage, limit) from None
                raise
        if "error" in response:
            raise WorkerFailure(response["error"])
        return response

    def _start(self) -> None:
        self.stderr_file = tempfile.TemporaryFile(mode="w+b")
        self.lines = queue.Queue()
        forked = None if self.env is not None else zygote.forked_worker(self.plugin_modules, self.disabled, self.stderr_file.fileno())
        if forked is not None:
            self.process = forked
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
            return
        env = threads.environment_for_partitions(os.environ if self.env is None else self.env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collage_core.measure.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        response = self._exchange({"op": "init", "plugins": self.plugin_modules, "disabled": self.disabled}, START_TIMEOUT_S)
        if "error" in response:
            self.close()
            raise WorkerFailure(f"worker could not load its plugins: {response['error']}")

    @staticmethod
    def _read(stream, lines):
        try:
            for line in stream:
                lines.put(line)
        except (ValueError, OSError):  # the stream closed under it (close() on an interrupt): the end, as EOF is
            pass
        lines.put(None)

    def _exchange(self, message: dict, timeout_s: float) -> dict:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader reports the death below, with the exit status
        return self._next(timeout_s)

    def _next(self, timeout_s: float) -> dict:
        waited_before = self._waited_s()
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            waited = self._waited_s() - waited_before  # before the kill: its threads go with it
            self.close()
            if waited >= HELD_UP_SHARE * timeout_s:
                raise TransientFailure(f"timed out after {timeout_s:.0f} s, {waited:.1f} s of them waiting for a processor") from None
            raise WorkerFailure(f"timed out after {timeout_s:.0f} s") from None
        if line is None:
            failure = self._death()
            self.close()
            raise failure
        return json.loads(line)

    def _death(self) -> WorkerFailure:
        code = self.process.wait(timeout=10)
        tail = self._stderr_tail()
        detail = f" ({tail})" if tail else ""
        if code >= 0:
            return WorkerFailure(f"worker exited with status {code}{detail}")
        name = signal.Signals(-code).name
        if -code in OUTSIDE_SIGNALS:
            return TransientFailure(f"worker crashed with {name}{detail}", signal_name=name)
        return WorkerFailure(f"worker crashed with {name}{detail}")

    def _waited_s(self) -> float:
        """Seconds the worker's threads have spent, all together, runnable but waiting for a
        processor (Linux's schedstat); 0 where the kernel does not say."""
        return sum(waited_ns_by_thread(self.process.pid).values()) / 1e9

    def _stderr_tail(self) -> str:
        self.stderr_file.seek(0)
        lines = [line.strip() for line in self.stderr_file.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                # The group holds what the worker started; the worker itself is killed on its own
                # too, in case it has not made its group yet (a worker forked an instant ago).
                for kill in (os.killpg, os.kill):
                    try:
                        kill(self.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self.process = None
        if self.stderr_file is not None:
            self.stderr_file.close()
            self.stderr_file = None


def describe_request(message: dict) -> str:
    """What ``message`` asks a worker to do, for a warning: its ``what``, else its placement."""
    if "what" in message:
        return message["what"]
    if "parts" in message:
        count, backends = len(message["parts"]), sorted({part["backend"] for part in message["parts"]})
        return f"placement of {count} partition{'s' if count != 1 else ''} on {', '.join(backends)}"
    return "placement" if message.get("op") == "run_placement" else f"{message.get('op')} request"
