"""Errors Collage reports to users."""

import contextlib
import signal
import threading
from typing import Iterator, Optional


class CollageError(Exception):
    """An error with a one-line message meant for the user."""


# The interrupt a signal raised while :func:`signals_noted` was in force, once one has.
_noted: list[KeyboardInterrupt] = []


def note_interrupt(interrupt: KeyboardInterrupt) -> KeyboardInterrupt:
    """Keep ``interrupt`` as the one a signal raised (a signal handler calls this before raising it), so that
    :func:`interrupt_within` finds it in any error that follows, however that error lost track of it."""
    _noted.append(interrupt)
    return interrupt


def _interrupted_by_sigint(signum, frame):
    raise note_interrupt(KeyboardInterrupt())


def _noting() -> bool:
    """Whether a :func:`signals_noted` block is in force: its handler is SIGINT's. Read from the handler, whose
    setting is one call, so that no signal landing between two steps of entering or leaving a block leaves
    the process believing it is in one."""
    return signal.getsignal(signal.SIGINT) is _interrupted_by_sigint


@contextlib.contextmanager
def signals_noted() -> Iterator[None]:
    """While inside (also as a decorator), a SIGINT that Python's own handler would answer raises a
    ``KeyboardInterrupt`` that is also noted (see :func:`note_interrupt`); on leaving the outermost such block,
    Python's handler is back and the note counts for nothing. Only the main thread, where Python runs signal
    handlers, takes part, and only where the program left SIGINT to Python's handler.

    The note is needed because an interrupt raised while TVM calls back into Python comes out of TVM as a
    plain ``RuntimeError`` with an empty message, neither caused by nor raised over the interrupt: without
    it, a run caught that error as one candidate's failure and went on as if Ctrl-C had not been pressed."""
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # nested, or not Python's
        yield
        return
    _noted.clear()
    try:
        signal.signal(signal.SIGINT, _interrupted_by_sigint)
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # first: a signal after it finds no block in force
        _noted.clear()


def interrupt_within(error: BaseException) -> Optional[KeyboardInterrupt]:
    """The interrupt (SIGINT, or SIGTERM as ``cli.Terminated``) that ``error`` was raised while handling
    or from, if any: a signal that arrives while a C extension imports or initialises surfaces as a
    ``SystemError`` or ``ImportError`` over it, and must stop the run as the interrupt would. Inside
    :func:`signals_noted`, any error that follows a signal is taken as that signal's interrupt."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KeyboardInterrupt):
            return error
        error = error.__cause__ or error.__context__
    return _noted[0] if _noted and _noting() else None


def reraise_interrupt(error: BaseException) -> None:
    """Raise the interrupt within ``error`` (see :func:`interrupt_within`), if there is one."""
    interrupt = interrupt_within(error)
    if interrupt is not None:
        raise interrupt


def last_line(text: str) -> str:
    """The last line of ``text`` that holds anything (where tracebacks and build errors put what went wrong)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


# How a message ends that says what went wrong in its first line instead (torch.export's errors, after their user
# stack and hints: "The error above occurred when calling torch.export.export. ...").
POINTS_ABOVE = "The error above occurred"


def one_line(error: BaseException) -> str:
    """An error in one line: its type and the last line of its message (where tracebacks put what went wrong), or its
    first where the last only points above it."""
    text = str(error)
    line = last_line(text)
    if line.startswith(POINTS_ABOVE):
        line = text.strip().splitlines()[0]
    return f"{type(error).__name__}: {line}".strip()
