"""Exported libraries that say what they need: the runtime file beside each, and loading by it.

A placed model's library is one TVM shared library (``export_library``, weights inside).
Partitions of backends other than TVM call functions their plugin registers at run time
(``collage_onnxruntime.run``, ``collage_dnnl.run``), so the library is written with
``<library>.runtime.json`` beside it: which backends its partitions run on, their versions and
what each needs. :func:`load_library` reads it, asks each backend's plugin to prepare the
process (``collage_prepare_runtime``), and says which backend is missing and how to install it
instead of failing later on an unknown function.

Backends whose partitions call native kernels name their shared libraries
(``collage_runtime_libraries``); exports carry copies in ``<library>.libs/``, listed in the
runtime file, so that a process with TVM's runtime alone (no compiler, no Collage plugins, as
on a deployment machine) loads those instead of asking the plugins.

A library built with other backend versions than those installed says so when it is loaded (a
warning through the ``collage`` logger, or an error with ``strict``): its partitions then run on
the installed backends' runtimes. Versions are compared as whole strings (``kernels-1`` is not
``kernels-1+threads-1``). With TVM's runtime alone nothing is compared: the carried kernels are
the ones the library was built with.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional

import tvm

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.errors import CollageError
from collage_core.measure import threads
from collage_core.outputs import output_folder
from collage_core.plugins import first_result, get_plugin_manager

FORMAT = "collage-runtime"
log = logging.getLogger("collage")
VERSION = 1
# The key of a library's shape profiles in its runtime file (collage_core.build.profiles).
SHAPE_PROFILES = "shape_profiles"


class LibraryLoadError(CollageError):
    """A library whose backends cannot run in this process; the message says which and how to fix it."""


def runtime_file(library: os.PathLike) -> Path:
    library = Path(library)
    return library.with_name(library.name + ".runtime.json")


def backend_needs(backends: Iterable, placed_on: Iterable[str]) -> dict:
    """For each backend (Backend records) a placement uses: its kind, version and what it needs at run time."""
    used = set(placed_on)
    return {
        backend.name: {"kind": backend.kind, "version": backend.version, "needs": backend.runtime_needs}
        for backend in sorted(backends, key=lambda b: b.name)
        if backend.name in used
    }


def runtime_libraries(pm, backends: Iterable) -> dict[str, list[Path]]:
    """For each backend (Backend records) that names them, the native libraries its partitions need
    (``collage_runtime_libraries``); backends that need their plugin at run time are left out."""
    found = {}
    for backend in backends:
        paths, errors = first_result(pm.hook.collage_runtime_libraries, backend=backend)
        missing = [str(path) for path in paths or () if not Path(path).is_file()]
        if errors or missing:  # the export still works where the plugin is installed; say why it carries nothing
            log.warning(
                "backend %s: exports carry no native kernels (%s)", backend.name, "; ".join(errors) or f"no such file: {', '.join(missing)}"
            )
        elif paths is not None:
            found[backend.name] = [Path(path) for path in paths]
    return found


def carried_dir(library: os.PathLike) -> Path:
    library = Path(library)
    return library.with_name(library.name + ".libs")


@contextlib.contextmanager
def replacing_outputs(directory: os.PathLike, library: os.PathLike, model_file: Optional[os.PathLike] = None) -> Iterator[None]:
    """For a block that saves a run's outputs, ``library`` among them, in ``directory``: once it has, the record of
    ``model_file`` is kept beside them (:func:`~collage_core.outputs.output_folder.record_model_file`), and the
    library of the outputs they replaced, another model's (the one the ``results.json`` before named), is removed
    with its runtime file and the native libraries it carries. What cannot be removed is left, with a warning: the
    run itself is saved. Nothing of this happens when the block raises."""
    replaced = _replaced_library(directory)
    yield
    if model_file is not None:
        output_folder.record_model_file(directory, model_file)
    if replaced is None or replaced.name == Path(library).name or not runtime_file(replaced).exists():
        return
    try:
        replaced.unlink(missing_ok=True)
        runtime_file(replaced).unlink(missing_ok=True)
        if carried_dir(replaced).exists():
            shutil.rmtree(carried_dir(replaced))
    except OSError as error:
        log.warning("%s, the library of the outputs this run replaced, could not be removed: %s", replaced, error)


def _replaced_library(directory: os.PathLike) -> Optional[Path]:
    """The library of the run whose ``results.json`` ``directory`` holds (None when it holds none, or the record
    cannot be read)."""
    try:
        name = json.loads((Path(directory) / "results.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return output_folder.library_file(directory, name) if isinstance(name, str) else None


def write_runtime_file(
    library: os.PathLike,
    needs: dict,
    carried: Optional[Mapping[str, list]] = None,
    environment: Optional[Mapping[str, str]] = None,
    shape_profiles: Optional[dict] = None,
) -> Path:
    """Record beside ``library`` the backends its partitions run on (as :func:`backend_needs` gives
    them); copy each backend's native libraries in ``carried`` (as :func:`runtime_libraries` gives
    them) into ``<library>.libs/`` and list them, so that the library loads without the plugins.
    When its partitions run on more than one backend, whose pools take turns, it also records how
    their idle threads are to wait (``environment``; default: as this run's partitions did,
    ``threads.wait_settings_in_force``), for :func:`load_library` to check. A library of shape profiles
    records them (``shape_profiles``, see :mod:`collage_core.build.profiles`)."""
    needs = copy.deepcopy(needs)
    for name, paths in sorted((carried or {}).items()):
        if name not in needs:
            continue
        relative = []
        for path in paths:
            # A backend's name is a plugin's to choose: it may not lead out of <library>.libs/.
            destination = carried_dir(library) / output_folder.safe_file_name(name, "backend") / Path(path).name
            destination.parent.mkdir(parents=True, exist_ok=True)
            output_folder.copy_file(path, destination)  # a new file: a process that loaded the old copy keeps it intact
            relative.append(destination.relative_to(Path(library).parent).as_posix())
        needs[name]["carried"] = relative
    record = {"format": FORMAT, "version": VERSION, "library": Path(library).name, "backends": needs}
    if len(needs) > 1:
        record["environment"] = dict(threads.wait_settings_in_force() if environment is None else environment)
    if shape_profiles is not None:
        record[SHAPE_PROFILES] = shape_profiles
    return output_folder.write_text(runtime_file(library), json.dumps(record, indent=1, sort_keys=True) + "\n")


def copy_library(source: os.PathLike, destination: os.PathLike, move: bool = False) -> None:
    """Copy (or move) ``source`` to ``destination`` with its runtime file and the native libraries it carries;
    each file is replaced whole, never truncated in place."""
    record = read_runtime_file(source)
    needs, carried = needs_and_carried(source, record)
    if move:
        output_folder.move_file(source, destination)
    else:
        output_folder.copy_file(source, destination)
    write_runtime_file(destination, needs, carried, record.get("environment"), record.get(SHAPE_PROFILES))
    if move:
        os.remove(runtime_file(source))
        shutil.rmtree(carried_dir(source), ignore_errors=True)


def needs_and_carried(library: os.PathLike, record: dict) -> tuple[dict, dict[str, list[Path]]]:
    """``library``'s runtime record (:func:`read_runtime_file`) as :func:`write_runtime_file` takes it: what each
    backend needs, and the paths of the native libraries each carries beside ``library``."""
    needs, carried = {}, {}
    for name, entry in record["backends"].items():
        needs[name] = {key: value for key, value in entry.items() if key != "carried"}
        if "carried" in entry:
            carried[name] = [Path(library).parent / relative for relative in entry["carried"]]
    return needs, carried


def read_runtime_file(library: os.PathLike) -> dict:
    path = runtime_file(library)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise LibraryLoadError(f"{library}: no {path.name} beside it saying which backends it needs") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise LibraryLoadError(f"{path}: not JSON ({error})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise LibraryLoadError(f"{path}: not a Collage runtime file")
    if record.get("version") != VERSION:
        raise LibraryLoadError(f"{path}: runtime file version {record.get('version')!r} (this Collage reads {VERSION})")
    if not isinstance(record.get("backends"), dict):
        raise LibraryLoadError(f"{path}: malformed runtime file (no backends)")
    return record


def other_versions(recorded: Mapping[str, str], installed: Mapping) -> list[tuple[str, str, str]]:
    """``(backend, recorded version, installed version)`` for each backend in ``recorded`` (name ->
    version) that ``installed`` (name -> Backend record) holds at another version."""
    return [
        (name, str(version), installed[name].version)
        for name, version in sorted(recorded.items())
        if name in installed and version is not None and str(version) != installed[name].version
    ]


# The version messages already given in this process: a placement file is read several times by one run.
_versions_told: set[str] = set()


def tell_other_versions(
    origin: str, recorded: Mapping[str, str], installed: Mapping, consequence: str, made: str = "built", strict: bool = False
) -> None:
    """For each backend ``origin`` was ``made`` with at another version than is installed here, a
    warning through the ``collage`` logger naming the backend and both versions (once per process),
    or with ``strict`` a :class:`LibraryLoadError` for the first."""
    for name, then, now in other_versions(recorded, installed):
        message = f"{origin} was {made} with {name} {then}, and {name} {now} is installed here: {consequence}"
        if strict:
            raise LibraryLoadError(message)
        if message not in _versions_told:
            _versions_told.add(message)
            log.warning("%s", message)


# The environment messages already given in this process.
_environment_told: set[str] = set()


def tell_other_environment(origin: str, recorded: Mapping[str, str]) -> None:
    """A warning through the ``collage`` logger (once per process) for each variable of how idle
    threads wait that ``origin`` was measured with and this process did not start with: the pools
    read them as they load, so only a process started with them runs as measured."""
    for name, value in sorted(recorded.items()):
        if os.environ.get(name) == value:
            continue
        message = (
            f"{origin} runs partitions of several backends whose thread pools take turns, measured with "
            f"{name}={value}; this process has {name}={os.environ.get(name, '(unset)')}: start it with "
            f"{name}={value} to run as measured (docs/threads.md)"
        )
        if message not in _environment_told:
            _environment_told.add(message)
            log.warning("%s", message)


def recorded_versions(backends: Mapping[str, Mapping]) -> dict[str, str]:
    """Each backend's version as a runtime file, an executor configuration or a placement records it."""
    return {name: entry.get("version") for name, entry in backends.items() if isinstance(entry, Mapping)}


def prepare_runtime(library: os.PathLike, pm=None) -> dict:
    """Make this process able to run ``library``'s partitions; the runtime record.

    With TVM's compiler each backend is prepared by its installed plugin
    (``collage_prepare_runtime``); with runtime-only TVM (no compiler, so no plugins) by loading
    the native libraries the export carried. One process never mixes the two, as a plugin's
    kernels and a copy of them would register the same functions twice.
    """
    record = read_runtime_file(library)
    runtime_only = not tvm_compat.has_compiler()
    installed = {} if runtime_only else installed_backends(pm)
    for name, needs in sorted(record["backends"].items()):
        wanted = needs.get("needs") or "its Collage plugin"
        if runtime_only and needs.get("carried") is not None:
            _load_carried(library, name, needs["carried"])
        elif runtime_only:
            raise LibraryLoadError(
                f"{library}: partitions run on backend {name}, which needs its plugin at run time, and TVM here is "
                f"runtime-only (no compiler, so no plugins): it needs {wanted} and the full apache-tvm"
            )
        elif name in installed:
            _prepare_by_plugin(library, name, installed[name], wanted, pm)
        else:
            raise LibraryLoadError(f"{library}: partitions run on backend {name}, which is not installed here: it needs {wanted}")
    return record


def installed_backends(pm=None) -> dict:
    """The backends installed here (Backend records by name)."""
    return {name: info.backend for name, info in discover_backends(pm or get_plugin_manager()).items()}


def _prepare_by_plugin(library, name: str, backend, wanted: str, pm) -> None:
    pm = pm or get_plugin_manager()
    ready, errors = first_result(pm.hook.collage_prepare_runtime, backend=backend)
    if not ready:
        problem = "; ".join(errors) or f"no plugin prepares backend {name}"
        raise LibraryLoadError(f"{library}: backend {name} cannot run here ({problem}); it needs {wanted}")


# The carried libraries loaded in this process, by backend: their SHA-256 digests. A second copy of
# the same kernels (another library's) is not loaded again; other kernels would register the same names.
_carried_loaded: dict[str, list[str]] = {}


def _load_carried(library, name: str, carried: list) -> None:
    for relative in carried:
        if not isinstance(relative, str) or Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise LibraryLoadError(f"{runtime_file(library)}: backend {name}'s runtime library {relative!r} is not beside the library")
    paths = [Path(library).parent / relative for relative in carried]
    for path in paths:
        if not path.is_file():
            raise LibraryLoadError(f"{library}: backend {name}'s runtime library {path} is missing")
    digests = [hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]
    if name in _carried_loaded:
        if _carried_loaded[name] != digests:
            raise LibraryLoadError(
                f"{library}: backend {name}'s kernels differ from those another library loaded in this process; "
                "load libraries built by different Collage versions in separate processes"
            )
        return
    for path in paths:
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise LibraryLoadError(f"{library}: backend {name}'s runtime library {path} does not load ({error})") from None
    _carried_loaded[name] = digests


def load_library(library: os.PathLike, *, pm=None, device=None, strict: bool = False, origin: Optional[str] = None):
    """``library`` loaded with TVM's runtime after preparing every backend it needs (and TVM's
    runtime for ``device``, where runtime-only TVM does not load it by itself). Built with other
    backend versions than those installed, it is loaded with a warning, or with ``strict`` refused;
    ``origin`` is how those messages name it (default: its path)."""

    if tvm_compat.has_compiler():  # the plugins prepare the backends: their versions are the ones that run
        record = read_runtime_file(library)
        tell_other_versions(
            origin or str(library),
            recorded_versions(record["backends"]),
            installed_backends(pm),
            "its partitions run on the installed version",
            strict=strict,
        )
    record = prepare_runtime(library, pm)
    tell_other_environment(origin or str(library), record.get("environment") or {})
    if device is not None:
        try:
            tvm_compat.ensure_device_runtime(device)
        except OSError as error:
            raise LibraryLoadError(f"{library}: TVM's runtime for {device} does not load ({error})") from None
    return tvm.runtime.load_module(str(library))


def load_vm(library: os.PathLike, device=None, *, pm=None, strict: bool = False, origin: Optional[str] = None):
    """A Relax virtual machine over ``library`` (on the CPU unless ``device`` is given); needs only TVM's
    runtime. Call its entry function with TVM tensors, ``vm["main"](tvm.runtime.tensor(x))``; it gives a
    tensor (``.numpy()``), or a tuple of them for several outputs. ``strict`` and ``origin`` as for
    :func:`load_library`."""

    device = device or tvm.cpu(0)
    return tvm_compat.virtual_machine(load_library(library, pm=pm, device=device, strict=strict, origin=origin), device)
