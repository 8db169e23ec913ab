"""A progress bar on stderr for long work; quiet lines instead of redraws when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

BAR_WIDTH = 28


class ProgressBar:
    """``total`` steps of work named ``label`` counted on ``stream`` (stderr): call :meth:`advance` after each
    step and :meth:`close` at the end (or use it as a context manager). A stream that is not a terminal gets a
    line every ten seconds and at the end instead of redraws; a disabled bar (or one with nothing to do) only counts."""

    def __init__(self, total: int, label: str, stream: Optional[TextIO] = None, enabled: bool = True):
        self.total = max(total, 0)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.total > 0
        self.done = 0
        self.started = time.monotonic()
        self.last_line = 0.0
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def advance(self, detail: str = "") -> None:
        """One more step done; ``detail`` (what it was) ends the line."""
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if self.interactive:
            self.stream.write("\r" + self._line(detail)[:160].ljust(100))
            self.stream.flush()
        elif now - self.last_line >= 10 or self.done == self.total:
            self.stream.write(self._line(detail) + "\n")
            self.stream.flush()
            self.last_line = now

    def _line(self, detail: str) -> str:
        filled = int(BAR_WIDTH * self.done / self.total)
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:.0f}s elapsed, ~{eta:.0f}s left  {detail}"

    def close(self) -> None:
        """End the bar's line; later steps are only counted."""
        if self.enabled and self.interactive:
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False


class Narrator:
    """Says what a run is doing on stderr, each line after the minutes and seconds since it started."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            minutes, seconds = divmod(int(time.perf_counter() - self.started), 60)
            print(f"[{minutes:02d}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


class PhaseClock:
    """Seconds spent in each phase of a run, in order (a phase lapped twice adds up)."""

    def __init__(self):
        self.phases_s: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases_s[phase] = self.phases_s.get(phase, 0.0) + now - self.last
        self.last = now
