"""Exported libraries that say what they need: the runtime file beside each, and loading by it.

A placed model's library is one TVM shared library (``export_library``, weights inside).
Partitions of backends other than TVM call functions their plugin registers at run time
(``collage_onnxruntime.run``, ``collage_dnnl.run``), so the library is written with
``<library>.runtime.json`` beside it: which backends its partitions run on, their versions and
what each needs. :func:`load_library` reads it, asks each backend's plugin to prepare the
process (``collage_prepare_runtime``), and says which backend is missing and how to install it
instead of failing later on an unknown function.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from collage_core.errors import CollageError

FORMAT = "collage-runtime"
VERSION = 1


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


def write_runtime_file(library: os.PathLike, needs: dict) -> Path:
    """Record beside ``library`` the backends its partitions run on (as :func:`backend_needs` gives them)."""
    record = {"format": FORMAT, "version": VERSION, "library": Path(library).name, "backends": needs}
    path = runtime_file(library)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


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


def prepare_runtime(library: os.PathLike, pm=None) -> dict:
    """Make this process able to run ``library``'s partitions; the runtime record."""
    from collage_core.backends import discover_backends
    from collage_core.plugins import first_result, get_plugin_manager

    record = read_runtime_file(library)
    pm = pm or get_plugin_manager()
    installed = {name: info.backend for name, info in discover_backends(pm).items()}
    for name, needs in sorted(record["backends"].items()):
        wanted = needs.get("needs") or "its Collage plugin"
        if name not in installed:
            raise LibraryLoadError(f"{library}: partitions run on backend {name}, which is not installed here: it needs {wanted}")
        ready, errors = first_result(pm.hook.collage_prepare_runtime, backend=installed[name])
        if not ready:
            problem = "; ".join(errors) or f"no plugin prepares backend {name}"
            raise LibraryLoadError(f"{library}: backend {name} cannot run here ({problem}); it needs {wanted}")
    return record


def load_library(library: os.PathLike, pm=None):
    """``library`` loaded with TVM's runtime after preparing every backend it needs."""
    import tvm

    prepare_runtime(library, pm)
    return tvm.runtime.load_module(str(library))


def load_vm(library: os.PathLike, device=None, pm=None):
    """A Relax virtual machine over ``library`` (on the CPU unless ``device`` is given)."""
    import tvm
    from tvm import relax

    return relax.VirtualMachine(load_library(library, pm), device or tvm.cpu(0))
