"""The parent's side of a measurement worker: start it, send it work, survive its crashes and hangs."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional, Sequence

from collage_core import zygote

# How long a fresh worker may take to load its plugins.
START_TIMEOUT_S = 120.0

class WorkerFailure(Exception):
    """The worker crashed, hung or answered with an error; the message says which and why."""


class StageTooSlow(WorkerFailure):
    """The step after ``stage`` took longer than its limit; the worker was stopped."""

    def __init__(self, stage: str, limit_s: float):
        super().__init__(f"the step after {stage!r} took longer than {limit_s:g} s")
        self.stage = stage
        self.limit_s = limit_s


class MeasurementWorker:
    """A ``python -m collage_core.worker`` process, restarted after any crash or timeout."""

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
        """
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
        forked = None if self.env is not None else zygote.forked_worker(self.plugin_modules, self.disabled,
                                                                         self.stderr_file.fileno())
        if forked is not None:
            self.process = forked
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
            return
        env = dict(os.environ if self.env is None else self.env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collage_core.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        response = self._exchange({"op": "init", "plugins": self.plugin_modules, "disabled": self.disabled},
                                   START_TIMEOUT_S)
        if "error" in response:
            self.close()
            raise WorkerFailure(f"worker could not load its plugins: {response['error']}")

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.put(line)
        lines.put(None)

    def _exchange(self, message: dict, timeout_s: float) -> dict:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader reports the death below, with the exit status
        return self._next(timeout_s)

    def _next(self, timeout_s: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise WorkerFailure(f"timed out after {timeout_s:.0f} s") from None
        if line is None:
            reason = self._death_reason()
            self.close()
            raise WorkerFailure(reason)
        return json.loads(line)

    def _death_reason(self) -> str:
        code = self.process.wait(timeout=10)
        if code < 0:
            what = f"crashed with {signal.Signals(-code).name}"
        else:
            what = f"exited with status {code}"
        tail = self._stderr_tail()
        return f"worker {what}" + (f" ({tail})" if tail else "")

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
