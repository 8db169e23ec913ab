"""Errors Collage reports to users."""

from typing import Optional


class CollageError(Exception):
    """An error with a one-line message meant for the user."""


def interrupt_within(error: BaseException) -> Optional[KeyboardInterrupt]:
    """The interrupt (SIGINT, or SIGTERM as ``cli.Terminated``) that ``error`` was raised while handling
    or from, if any: a signal that arrives while a C extension imports or initialises surfaces as a
    ``SystemError`` or ``ImportError`` over it, and must stop the run as the interrupt would."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KeyboardInterrupt):
            return error
        error = error.__cause__ or error.__context__
    return None


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
