"""An output folder that is safe to kill and to share: names from inputs stay inside it, every file is
replaced whole, one run writes into it at a time, and each run's scratch files are its own.

- A name taken from an input (a model's graph name, a model file's name, a backend's name) becomes a
  file name by :func:`safe_file_name`: a plain name is kept as it is, and no name leaves the folder.
- Every file is written under a temporary name beside it and renamed into place (:func:`replacing`),
  so a run killed while writing leaves the file before whole, and a process that loaded the old file
  (a library) keeps it intact: the new one is another inode, never the old one truncated.
- A run holds the folder (:func:`held`) with ``fcntl.flock`` on ``.collage.lock``: a second run stops
  with one line naming the folder and the holder's pid. The kernel releases the lock of a dead
  process, so a killed run's lock is free at once.
- A run's scratch files (inputs, outputs, modules sent to workers, the rivals' builds) live in its
  own ``.run-<pid>-<random>/`` in the folder, removed when the run ends, fails or is interrupted (as
  are half-written files of its workers); those of a killed run (SIGKILL) are removed by the next run
  that holds the folder.
- While a run holds the folder, temporary files go to its scratch too (:func:`temporary_files_in`):
  ``TMPDIR`` and ``tempfile.tempdir`` name ``.run-*/tmp``, so what its workers and the libraries
  they call make there (TVM's links, a killed worker's files) goes with the scratch.
- A run from a model file records that file's path in the folder (``.collage-model``), so that the default
  folder of another file of the same name (``a/model.onnx``, ``b/model.onnx``) is another folder
  (:func:`default_for`) rather than the first one's outputs overwritten.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
import unicodedata
from pathlib import Path
from typing import Iterator, Optional

import attrs

from collage_core.errors import CollageError

LOCK_FILE = ".collage.lock"
SCRATCH_PREFIX = ".run-"
# The mark of a file being written (see replacing); one left by a killed run is removed by the next.
PARTIAL = ".partial"
# Room for the longest suffix a library's files add (".so.runtime.json") and a temporary name's
# marks within the 255 bytes a file name may have.
NAME_BYTES = 180
DEFAULT_NAME = "model"
# Where a folder keeps the path of the model file its outputs were made from (see default_for).
MODEL_FILE_RECORD = ".collage-model"
DEFAULT_ROOT = Path("collage-out")


class OutputFolderInUse(CollageError):
    """Another run holds the output folder."""


@attrs.frozen
class RunFolder:
    """Where a run writes: ``path``, the caller's output folder (``kept``) or else a temporary one, and
    the run's own ``scratch`` inside it (see :func:`held`)."""

    path: Path
    scratch: Path
    kept: bool


@contextlib.contextmanager
def for_run(output_dir: Optional[os.PathLike]) -> Iterator[RunFolder]:
    """The folder a run writes in, held for it (see :func:`held`): ``output_dir``, made as needed, or a
    temporary folder, removed if the run fails (on success it lives as long as the run's result). Held
    first, so that a second run into the folder stops before it imports anything."""
    path = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="collage-"))
    made = first_missing(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        with held(path, made) as scratch:
            yield RunFolder(path, scratch, kept=bool(output_dir))
    except BaseException:
        if not output_dir:
            shutil.rmtree(path, ignore_errors=True)
        raise


def first_missing(folder: Path) -> Optional[Path]:
    """The outermost of ``folder`` and the folders above it that do not exist yet (None when it exists)."""
    missing = None
    while not folder.exists() and folder != folder.parent:
        missing, folder = folder, folder.parent
    return missing


def say_what_is_overwritten(folder: Path, replaying: Optional[os.PathLike], say) -> None:
    """One line when this run writes over another kind of run's files in ``folder``: a replay over a
    search's (or over another file's replay), a search over a replay's. A search over a search says
    whether it reuses it (see ``collage_core.outputs.reuse``)."""
    try:
        before = json.loads((folder / "results.json").read_text()).get("replayed_from")
    except (OSError, ValueError, AttributeError):
        return
    replaying = None if replaying is None else str(replaying)
    if before == replaying:
        return
    kind = "searched run" if before is None else f"replay of {before}"
    say(f"overwriting the {kind} in {folder} (its placement.json, report.txt, results.json and library)")


def safe_file_name(name: str, default: str = DEFAULT_NAME) -> str:
    """``name`` as a file name that stays in its folder: path separators, NUL and other control
    characters become ``_``, leading dots go (so neither ``..`` nor a hidden file), and a name over
    NAME_BYTES bytes in UTF-8 is cut and ends in a digest of the whole, so that long names stay
    distinct. An empty result is ``default``. A plain name (``tiny_resnet``) is kept as it is."""
    cleaned = "".join("_" if ch in "/\\" or unicodedata.category(ch).startswith("C") else ch for ch in str(name))
    cleaned = cleaned.lstrip(".")
    encoded = cleaned.encode("utf-8", "replace")
    if len(encoded) > NAME_BYTES:
        digest = hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:12]
        cleaned = encoded[: NAME_BYTES - len(digest) - 1].decode("utf-8", "ignore") + "-" + digest
    return cleaned or default


def named_for(model_file: os.PathLike, root: os.PathLike = DEFAULT_ROOT) -> Path:
    """``root/<the model file's name>``, that name as a safe file name (:func:`safe_file_name`): the folder
    :func:`default_for` gives unless another file of the name holds it."""
    return Path(root) / safe_file_name(Path(model_file).stem)


def default_for(model_file: os.PathLike, root: os.PathLike = DEFAULT_ROOT) -> Path:
    """The folder a run from ``model_file`` writes when given none: ``root/<the file's name>`` (a safe file
    name: :func:`safe_file_name`), unless that folder holds the outputs of another model file that still
    exists, when it is ``root/<the file's name>-<a digest of the file's path>``: ``a/model.onnx`` and
    ``b/model.onnx`` keep their outputs apart, and each keeps its own folder run after run."""
    source = os.path.realpath(model_file)
    folder = named_for(model_file, root)
    other = recorded_model_file(folder)
    if other is None or other == source or not os.path.exists(other):
        return folder
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return folder.with_name(f"{folder.name}-{digest}")  # at most NAME_BYTES + 9 bytes: a name may have 255


def recorded_model_file(folder: os.PathLike) -> Optional[str]:
    """The model file whose outputs ``folder`` holds, as :func:`record_model_file` kept it (None when none
    was kept or the record cannot be read)."""
    try:
        recorded = json.loads((Path(folder) / MODEL_FILE_RECORD).read_text(encoding="utf-8"))["model_file"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return recorded if isinstance(recorded, str) else None


def record_model_file(folder: os.PathLike, model_file: os.PathLike) -> None:
    """Keep in ``folder`` that its outputs come from ``model_file`` (its real path), for :func:`default_for`."""
    write_text(Path(folder) / MODEL_FILE_RECORD, json.dumps({"model_file": os.path.realpath(model_file)}) + "\n")


def library_file(directory: os.PathLike, model_name: str) -> Path:
    """Where a run writes the library of the model called ``model_name`` in ``directory``."""
    return Path(directory) / f"{safe_file_name(model_name)}.so"


def refuse_special_file(path: os.PathLike) -> None:
    """:class:`CollageError` when ``path`` exists and is neither a regular file nor a folder (a device such as
    ``/dev/null``, a pipe, a socket): Collage writes a file by renaming a new one onto its name, which would put a
    regular file in that one's place rather than write into it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = (
            "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a pipe"
            if stat.S_ISFIFO(mode)
            else "a socket or other special file"
        )
        raise CollageError(f"{path}: is {kind}, not a file Collage can replace; name a regular file to write")


@contextlib.contextmanager
def replacing(path: os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` (with its suffix, so that a library's exporter links the same
    kind of file) to write; renamed onto ``path`` when the block ends, removed if it raises. An error
    naming the temporary path names ``path`` instead: that is the file the user knows. A ``path`` that is a
    device, a pipe or a socket is refused (:func:`refuse_special_file`)."""
    path = Path(path)
    refuse_special_file(path)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}{PARTIAL}{path.suffix}")
    try:
        yield temporary
        os.replace(temporary, path)
    except OSError as error:
        if error.filename is not None and str(error.filename) == str(temporary):
            error.filename = str(path)
        raise
    finally:
        temporary.unlink(missing_ok=True)


def write_text(path: os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` whole: a reader never sees half a file, and a run killed meanwhile leaves
    the file before as it was."""
    with replacing(path) as temporary:
        temporary.write_text(text)
    return Path(path)


def write_bytes(path: os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole, as :func:`write_text` writes text."""
    with replacing(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def copy_file(source: os.PathLike, destination: os.PathLike) -> None:
    """Copy ``source`` onto ``destination`` whole (a new file: a process that loaded the old one keeps it)."""
    with replacing(destination) as temporary:
        shutil.copyfile(source, temporary)


def move_file(source: os.PathLike, destination: os.PathLike) -> None:
    """Move ``source`` onto ``destination`` whole, by renaming where both are on one file system."""
    try:
        os.replace(source, destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        copy_file(source, destination)
        os.remove(source)


def export_library(executable, path: os.PathLike) -> None:
    """TVM's ``executable.export_library`` to ``path``, linked under a temporary name and renamed into
    place: a link killed midway leaves the library before intact."""
    with replacing(path) as temporary:
        executable.export_library(str(temporary))


@contextlib.contextmanager
def held(directory: os.PathLike, made: Optional[os.PathLike] = None) -> Iterator[Path]:
    """Hold ``directory`` for one run (held by another, :class:`OutputFolderInUse` is raised at once);
    gives the run's scratch folder inside it, removed when the block ends, however it ends.

    ``made`` is the outermost folder the run made for ``directory`` (itself or a parent); if the block
    fails and nothing but folders and the lock is in it, it is removed, while the folder is still
    held: a run that fails before writing anything (a model that does not exist) leaves no folder
    behind. A run refused because the folder is in use removes nothing."""
    directory = Path(directory)
    with _locked(directory):
        _remove_leftovers(directory)
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=directory))
        failed = True
        try:
            with temporary_files_in(scratch / "tmp"):
                yield scratch
            failed = False
        finally:
            # With the scratch, what a worker stopped midway (by an interrupt, a failure) left half written.
            _remove_leftovers(directory)
            if failed and made is not None and all(path.is_dir() or path.name == LOCK_FILE for path in Path(made).rglob("*")):
                shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def saving_into(directory: os.PathLike, what: str) -> Iterator[Path]:
    """``directory`` (made if it does not exist) held while a result is saved into it by hand, as a run holds its
    folder (held by a run, :class:`OutputFolderInUse`); a run saves its own result into the folder it holds
    without this. An empty name is refused: it would be the current folder."""
    if str(directory) == "":
        raise CollageError(f"{what}: the folder is an empty string; name one ('.' for the current folder)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        yield directory


@contextlib.contextmanager
def temporary_files_in(folder: os.PathLike) -> Iterator[Path]:
    """Within the block, this process's temporary files and those of the processes it starts go to
    ``folder`` (made here): ``TMPDIR`` and ``tempfile.tempdir`` name it, and are restored after.
    Workers forked from a zygote started earlier take the folder in their fork request
    (``collage_core.measure.zygote``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before_env, before_module = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = before_module
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    path = directory / LOCK_FILE
    try:
        # Never through a link: a lock file planted as a link in a shared folder would have the run overwrite its target.
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CollageError(f"{path}: is a symbolic link; Collage writes its lock file only as a file of its own") from None
        raise CollageError(f"{directory}: cannot write into it ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise CollageError(f"{path}: is not a regular file; Collage writes its lock file only as a file of its own")
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            raise OutputFolderInUse(
                f"{directory} is in use by another Collage run (pid {holder}); wait for it to end or choose another output directory"
            ) from None
        except OSError as error:  # a file system without locks
            raise CollageError(f"{directory}: cannot lock {LOCK_FILE} ({error.strerror})") from None
        if not _names(path, descriptor):  # a run that failed removed the folder, lock and all, as this one locked it
            raise OutputFolderInUse(f"{directory} was removed by another Collage run as this one started; run again")
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock; the file stays, so that no two runs lock different files


def _names(path: Path, descriptor: int) -> bool:
    """Whether ``path`` is still the file open as ``descriptor`` (neither removed nor replaced)."""
    try:
        found = os.stat(path)
    except OSError:
        return False
    opened = os.fstat(descriptor)
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def _remove_leftovers(directory: Path) -> None:
    """Scratch folders and half-written files left by runs killed before they could remove them, or by
    this run's workers stopped midway: this run holds the folder, so no other run is using them."""
    for entry in directory.iterdir():
        if entry.name.startswith(SCRATCH_PREFIX) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(".") and PARTIAL in entry.name and entry.is_file():
            entry.unlink(missing_ok=True)
