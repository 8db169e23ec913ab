"""Errors Collage reports to users."""

import contextlib
import signal
import threading
from typing import Iterator, Optional


class CollageError(Exception):
    """An error with a one-line message meant for the user."""


# The interrupt a signal raised while :func:`signals_noted` was in force, once one has; and how many
# signals_noted blocks the main thread is in (the note counts only inside one).
_noted: list[KeyboardInterrupt] = []
_depth = 0
_HELD_WHILE_ENTERING = (signal.SIGINT, signal.SIGTERM)


def note_interrupt(interrupt: KeyboardInterrupt) -> KeyboardInterrupt:
    """Keep ``interrupt`` as the one a signal raised (a signal handler calls this before raising it), so that
    :func:`interrupt_within` finds it in any error that follows, however that error lost track of it."""
    _noted.append(interrupt)
    return interrupt


def _interrupted_by_sigint(signum, frame):
    raise note_interrupt(KeyboardInterrupt())


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered once the block ends) where the platform can hold them: entering and
    leaving :func:`signals_noted` is then never cut in two by one."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_WHILE_ENTERING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def signals_noted() -> Iterator[None]:
    """While inside (also as a decorator), a SIGINT that Python's own handler would answer raises a
    ``KeyboardInterrupt`` that is also noted (see :func:`note_interrupt`); on leaving the outermost such block,
    the handler before is back and nothing is noted. Only the main thread, where Python runs signal handlers,
    takes part; blocks in other threads change nothing.

    The note is needed because an interrupt raised while TVM calls back into Python comes out of TVM as a
    plain ``RuntimeError`` with an empty message, neither caused by nor raised over the interrupt: without
    it, a run caught that error as one candidate's failure and went on as if Ctrl-C had not been pressed."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _signals_held():
        outermost, _depth = _depth == 0, _depth + 1
        replaced = None
        if outermost:
            _noted.clear()
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                replaced = signal.signal(signal.SIGINT, _interrupted_by_sigint)
    try:
        yield
    finally:
        with _signals_held():
            _depth -= 1
            if outermost:
                if replaced is not None:
                    signal.signal(signal.SIGINT, replaced)
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
    return _noted[0] if _noted and _depth else None


def reraise_interrupt(error: BaseException) -> None:
    """Raise the interrupt within ``error`` (see :func:`interrupt_within`), if there is one."""
    interrupt = interrupt_within(error)
    if interrupt is not None:
        raise interrupt


def last_line(text: str) -> str:
    """The last line of ``text`` that holds anything (where tracebacks and build errors put what went wrong)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def one_line(error: BaseException) -> str:
    """An error in one line: its type and the last line of its message (where tracebacks put what went wrong)."""
    return f"{type(error).__name__}: {last_line(str(error))}".strip()
