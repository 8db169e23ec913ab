"""Model Library Format for placed Relax models: a tar downstream build automation can read, and loading it back
(exporting it is :mod:`collage_core.outputs.mlf_export`).

TVM's Model Library Format (MLF) handed a compiled model to build systems as one tar; it left
TVM with microTVM. This is its layout adapted to Relax executables:

    metadata.json                  format version, model, export time (UTC), targets, executor,
                                   memory map, placement summary, what each partition calls,
                                   every file with its SHA-256 and its size
    codegen/host/lib/lib0.o ...    the compiled host code, one object file per module
                                   (``devc.o`` holds the VM bytecode and constants)
    parameters/<model>.params      the weights, in TVM's parameter serialization
    runtime/<backend>/<library>    native libraries partitions call (``collage_runtime_libraries``),
                                   so the model loads with TVM's runtime alone
    src/relax.txt                  the partitioned Relax IR (each partition's backend in its attributes)
    src/lowered/NNN-<function>.txt each function of the model lowered: what a partition calls (packed
                                   functions, external functions, TIR) and the TIR it calls;
                                   numbered, with names reduced to letters, digits and ``_``
    executor-config/relax-vm.json  entry function, inputs and outputs, device, runtime needs
    placement.json                 the placement, as ``collage optimize`` writes it

Host code is always object files, compiled at export: a placement with no TIR for the host (ONNX
Runtime or OpenVINO alone) leaves TVM with C sources, which are compiled then with TVM's own
compiler driver (see :func:`tvm_compat.host_objects`). So loading needs a linker and never a
compiler that would have to agree with the exporter's, every tar loads the same way, and a tar's
host code is checked once, where it was made.

The tar is deterministic: sorted members, owner root (uid/gid 0), fixed mode, and every
timestamp set to ``SOURCE_DATE_EPOCH`` when that is set (the export time too), else to 0 in
the tar. :func:`~collage_core.outputs.mlf_export.export_mlf` with ``check_inputs`` loads what it wrote in a new process and runs
it once before giving it its name (:func:`check_in_new_process`). :func:`load_mlf` checks the
format version and every file against the metadata, reading only the files the metadata lists,
streamed to disk and hashed as they are read, within bounds on the tar's size; it links the objects
with the host compiler, prepares the backends' runtimes and returns a model that runs on the
placement's device. Its errors name the tar, never the files it is unpacked to.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import weakref
import zlib
from pathlib import Path
from typing import Optional, Sequence

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.build.deploy import load_vm, write_runtime_file
from collage_core.errors import CollageError
from collage_core.measure.arrays_file import load_arrays
from collage_core.outputs.dispatch import ShapeDispatch, ShapeRecordError, run_dispatched
from collage_core.outputs.index_ranges import IndexRange, check_index_ranges
from collage_core.outputs.output_folder import library_file, safe_file_name
from collage_core.outputs.run_inputs import Expected, checked_inputs

FORMAT = "collage-model-library-format"
VERSION = 1
EXECUTOR = "relax-vm"
EXECUTOR_CONFIG = "executor-config/relax-vm.json"
OBJECTS_DIR = "codegen/host/lib/"
RELAX_TEXT = "src/relax.txt"
LOWERED_DIR = "src/lowered/"
PLACEMENT = "placement.json"
RUNTIME_DIR = "runtime/"
# The packed functions of TVM's own VM (memory, shapes) that every lowered function calls: not listed.
CALL_KINDS = {"packed_functions": "packed functions", "external_functions": "external functions", "tir_functions": "TIR functions"}
# What a new process runs to check an exported tar: load it as a user would and run it once.
RUN_ONCE = "import sys\nfrom collage_core.outputs.mlf import _run_once\nsys.exit(_run_once(*sys.argv[1:]))\n"
# Inductor compiles its partitions when they first run: minutes for a large model.
CHECK_TIMEOUT_S = 1800.0
# Bounds on a tar the loader reads, checked from its headers before any member is: a model's tar is
# megabytes to a few gigabytes (a 7-billion-parameter model's float16 weights are 14 GB).
MAX_UNPACKED_BYTES = 16 * 2**30
MAX_MEMBERS = 100_000
# tarfile reads each header whole, a long name or PAX extension too: 512 bytes a member, rarely more.
MAX_HEADER_BYTES = 256 * 2**20
# metadata.json and the executor configuration are read whole; a large model's are a few megabytes.
MAX_JSON_BYTES = 64 * 2**20
# Members are streamed to disk in pieces of this size.
READ_CHUNK = 2**20
# The compressions tarfile reads (its "r:*"), by their first bytes.
COMPRESSIONS = ((b"\x1f\x8b", gzip.GzipFile), (b"BZh", bz2.BZ2File), (b"\xfd7zXZ\x00", lzma.LZMAFile))


class MLFError(CollageError):
    """A Model Library Format tar that cannot be written or read; the message names the file and the problem."""


def check_in_new_process(path: os.PathLike, inputs: Sequence[np.ndarray], timeout_s: float = CHECK_TIMEOUT_S) -> list[np.ndarray]:
    """Load the tar at ``path`` in a new Python process as a user would (:func:`load_mlf` with every
    installed plugin) and run its entry function once on ``inputs``; its outputs, once they are checked
    to be those its executor configuration declares. A crash there cannot take this process down;
    whatever went wrong is an :class:`MLFError` naming ``path`` and the problem in one line. The tar is
    unpacked in a folder of this process's, removed however the new one ends."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="collage-mlf-check-") as scratch:
        given, taken, unpacked = Path(scratch) / "inputs.npz", Path(scratch) / "outputs.npz", Path(scratch) / "unpacked"
        np.savez(given, *inputs)
        try:
            result = subprocess.run(
                [sys.executable, "-c", RUN_ONCE, str(path), str(given), str(taken), str(unpacked)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise MLFError(f"{path}: loading it and running it once took over {timeout_s:g} s in a new process") from None
        problem = _last_line(result.stderr).removeprefix(f"{path}: ")
        if result.returncode < 0:
            raise MLFError(
                f"{path}: the process loading it died of {signal.Signals(-result.returncode).name}" + (f" ({problem})" if problem else "")
            )
        if result.returncode != 0:
            raise MLFError(f"{path}: {problem or f'the process loading it ended with exit status {result.returncode}'}")
        return load_arrays(taken)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run_once(path: str, inputs: str, outputs: str, workdir: str) -> int:
    """In the process :func:`check_in_new_process` starts: load (unpacked in ``workdir``), run once, check the
    outputs' shapes and dtypes."""
    try:
        loaded = load_mlf(path, workdir)
        results = loaded.run(*load_arrays(inputs))
        declared = [(tuple(o["shape"]), o["dtype"]) for o in loaded.executor_config["outputs"]]
        given = [(tuple(o.shape), str(o.dtype)) for o in results]
        if given != declared:
            raise MLFError(f"{path}: its run gave outputs {given}, and its executor configuration declares {declared}")
    except CollageError as error:
        print(error, file=sys.stderr)
        return 1
    np.savez(outputs, *results)
    return 0


@attrs.define
class LoadedMLF:
    """A Model Library Format tar linked and loaded: its metadata and a VM ready to run ``main``."""

    metadata: dict
    executor_config: dict
    parameters: dict
    vm: object = attrs.field(repr=False)
    library: Path
    device: object = attrs.field(repr=False)
    # The executor configuration's input_ranges: integer inputs that index a table, which run checks
    index_ranges: tuple = ()

    @property
    def input_specs(self) -> list[dict]:
        """Each input ``main`` takes, in order: ``{"name": ..., "shape": [...], "dtype": ...}``."""
        return self.executor_config["inputs"]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs of the model's shapes and dtypes, made as ``ImportedModel.random_inputs`` makes them (the
        same seed gives the same arrays): uniform floats in [-1, 1), integers 0 or 1, booleans true."""
        rng = np.random.default_rng(seed)
        arrays = []
        for spec in self.input_specs:
            shape, dtype = tuple(spec["shape"]), spec["dtype"]
            if dtype.startswith(("int", "uint")):
                arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
            elif dtype == "bool":
                arrays.append(np.ones(shape, dtype=bool))
            else:
                arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
        return arrays

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """``main`` on numpy arrays (one per input, as :attr:`input_specs` lists them); its outputs as numpy arrays.
        A tar of several shapes runs the entry function of the inputs' shapes, or of the smallest that covers them,
        padded (:mod:`collage_core.outputs.dispatch`); :attr:`input_specs` are its largest shape's. An integer
        input outside the range the configuration's ``input_ranges`` gives it (a token id past the vocabulary) is
        refused before anything runs (:class:`~collage_core.outputs.index_ranges.IndexOutOfRange`), and so are
        inputs of another number, type or (one shape) shape (:class:`~collage_core.outputs.run_inputs.InputMismatch`)."""
        shapes = self.executor_config.get("shape_profiles")
        inputs = checked_inputs(
            [Expected(spec["name"], spec["dtype"], None if shapes is not None else spec["shape"]) for spec in self.input_specs], inputs
        )
        check_index_ranges(self.index_ranges, inputs)
        if shapes is not None:
            return run_dispatched(self.vm, self.device, ShapeDispatch.from_json(shapes, EXECUTOR_CONFIG), inputs)
        result = self.vm["main"](*[tvm_compat.to_tensor(a, self.device) for a in inputs])
        results = result if not hasattr(result, "numpy") else [result]
        return [tvm_compat.to_numpy(r) for r in results]


class _TarStream:
    """A tar's uncompressed bytes as tarfile reads them. While the headers are read, what tarfile asks
    for is counted against :data:`MAX_HEADER_BYTES`: tarfile reads a header's extension (a long name,
    PAX records) whole into memory, so a crafted header declaring 64 GiB would be allocated."""

    def __init__(self, stream):
        self.stream = stream
        self.header_bytes_left: Optional[int] = MAX_HEADER_BYTES

    def read(self, size: int = -1) -> bytes:
        if self.header_bytes_left is not None:
            if size is None or size < 0 or size > self.header_bytes_left:
                raise _TooLarge(f"its headers take more than {_size(MAX_HEADER_BYTES)}")
            self.header_bytes_left -= size
        return self.stream.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()


class _TooLarge(Exception):
    """A tar over one of the loader's bounds; the message says which."""


def _size(count: int) -> str:
    return f"{count / 2**30:g} GiB" if count >= 2**30 else f"{count / 2**20:g} MiB"


def _uncompressed(raw) -> object:
    """The tar's bytes from ``raw`` (its file), uncompressed as ``tarfile.open(mode="r:*")`` would."""
    magic = raw.read(6)
    raw.seek(0)
    for prefix, opener in COMPRESSIONS:
        if magic.startswith(prefix):
            return opener(fileobj=raw)
    return raw


def _headers(path: Path, archive: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """Every regular file of the tar by name, its headers read within the loader's bounds."""
    found, unpacked = {}, 0
    for count, info in enumerate(iter(archive.next, None), 1):
        unpacked += info.size
        if count > MAX_MEMBERS:
            raise _TooLarge(f"it has more than {MAX_MEMBERS} members")
        if unpacked > MAX_UNPACKED_BYTES:
            raise _TooLarge(f"its members unpack to more than {_size(MAX_UNPACKED_BYTES)}")
        if info.isreg():
            if info.name in found:
                raise MLFError(f"{path}: {info.name} is in the tar twice")
            found[info.name] = info
    return found


def _within_json_bound(path: Path, member: str, size: int) -> None:
    if size > MAX_JSON_BYTES:
        raise MLFError(f"{path}: {member} is {size} bytes, over the {_size(MAX_JSON_BYTES)} Collage reads of it")


def _read_whole(path: Path, archive: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    _within_json_bound(path, info.name, info.size)
    with archive.extractfile(info) as source:
        return source.read(info.size)


def _json(path: Path, member: str, data: bytes):
    """``data`` (the member ``member``) parsed as JSON; anything else is an :class:`MLFError` naming both."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MLFError(f"{path}: {member} is not JSON ({error})") from None
    except RecursionError:
        raise MLFError(f"{path}: {member} is not JSON Collage reads (nested too deeply)") from None


def _checked_metadata(path: Path, metadata) -> dict:
    if not isinstance(metadata, dict):
        raise MLFError(f"{path}: metadata.json is not Collage's Model Library Format (a JSON {type(metadata).__name__}, not an object)")
    if metadata.get("format") != FORMAT:
        raise MLFError(f"{path}: metadata.json is not Collage's Model Library Format (format {metadata.get('format')!r})")
    if metadata.get("version") != VERSION:
        raise MLFError(f"{path}: Model Library Format version {metadata.get('version')!r} (this Collage reads version {VERSION})")
    listed = metadata.get("files")
    if not isinstance(listed, dict) or not listed:
        raise MLFError(f"{path}: metadata.json lists no files")
    if not all(isinstance(member, str) and isinstance(digest, str) for member, digest in listed.items()):
        raise MLFError(f"{path}: metadata.json's files must map each member to its SHA-256 as text")
    sizes = metadata.get("sizes", {})
    if not isinstance(sizes, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes.values()):
        raise MLFError(f"{path}: metadata.json's sizes must map members to their sizes in bytes")
    for member in listed:
        parts = member.split("/")
        if member.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise MLFError(f"{path}: member {member} points outside the tar")
    for required in (EXECUTOR_CONFIG, PLACEMENT, RELAX_TEXT):
        if required not in listed:
            raise MLFError(f"{path}: {required} is missing")
    if not any(member.startswith(OBJECTS_DIR) for member in listed):
        raise MLFError(f"{path}: no compiled host code under {OBJECTS_DIR}")
    name = metadata.get("model_name")
    if not isinstance(name, str) or not name:
        raise MLFError(f"{path}: model name {name!r} in metadata.json is not a name")
    return metadata


def _parameters_member(model_name: str) -> str:
    """The tar member of the model's weights, named after the model as a file name that stays in its
    folder (a model's name may hold spaces, non-ASCII letters, or slashes that must choose no path)."""
    return f"parameters/{safe_file_name(model_name)}.params"


def _checked_config(path: Path, config) -> dict:
    """The executor configuration, each field the loader and :class:`LoadedMLF` read of the type they read."""

    def fail(problem: str):
        raise MLFError(f"{path}: {EXECUTOR_CONFIG}: {problem}")

    if not isinstance(config, dict):
        fail(f"a JSON object is wanted, not {type(config).__name__}")
    if config.get("executor") != EXECUTOR:
        raise MLFError(f"{path}: executor {config.get('executor')!r} (this Collage runs {EXECUTOR})")
    backends = config.get("runtime_backends")
    if not isinstance(backends, dict) or not all(isinstance(needs, dict) for needs in backends.values()):
        fail("runtime_backends must map each backend to what it needs")
    if not isinstance(config.get("device", "cpu"), (str, type(None))):
        fail(f"device must be a name such as cpu or cuda, not {config['device']!r}")
    for kind in ("inputs", "outputs"):
        tensors = config.get(kind)
        if not isinstance(tensors, list) or not all(_is_tensor_spec(spec) for spec in tensors):
            fail(f"{kind} must list each tensor's name, shape (non-negative integers) and dtype")
    if "shape_profiles" in config:
        try:
            ShapeDispatch.from_json(config["shape_profiles"], "shape_profiles")
        except ShapeRecordError as error:
            fail(str(error))
    return config


def _input_ranges(path: Path, config: dict) -> tuple[IndexRange, ...]:
    """The configuration's ``input_ranges`` (none in a tar exported before they were recorded)."""
    try:
        return tuple(IndexRange.from_json(limit) for limit in config.get("input_ranges", []))
    except (TypeError, ValueError, KeyError, AttributeError):
        raise MLFError(f"{path}: {EXECUTOR_CONFIG}: input_ranges must list each input's index, name, low and high") from None


def _is_tensor_spec(spec) -> bool:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("dtype"), str):
        return False
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return False
    try:
        np.dtype(spec["dtype"])
    except TypeError:
        return False
    return True


def _unpack(path: Path, workdir: Path) -> dict:
    """Check the tar at ``path`` against its metadata.json and write what it lists into ``workdir``, each
    member at its name there, hashed as it is read; the metadata. Members it does not list are never read."""
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise MLFError(f"{path}: no such file") from None
    except OSError as error:
        raise MLFError(f"{path}: not a readable tar ({error.strerror})") from None
    stream, opened = None, False
    try:
        stream = _TarStream(_uncompressed(raw))
        with tarfile.open(fileobj=stream, mode="r:") as archive:
            opened = True
            found = _headers(path, archive)
            stream.header_bytes_left = None  # what follows is member data, read a chunk at a time
            if "metadata.json" not in found:
                _refuse_if_cut_short(path, stream, archive)
                raise MLFError(f"{path}: no metadata.json (not a Model Library Format tar)")
            metadata = _checked_metadata(path, _json(path, "metadata.json", _read_whole(path, archive, found["metadata.json"])))
            listed, sizes = metadata["files"], metadata.get("sizes", {})
            for member in sorted(listed):
                if member not in found:
                    _refuse_if_cut_short(path, stream, archive)
                    raise MLFError(f"{path}: {member} is listed in metadata.json but missing from the tar")
                if member in sizes and found[member].size != sizes[member]:
                    raise MLFError(f"{path}: {member} is {found[member].size} bytes in the tar, and metadata.json declares {sizes[member]}")
            for member in sorted(listed, key=lambda name: found[name].offset):  # in the tar's order: no going back
                _stream(path, archive, found[member], workdir / member, listed[member])
    except _TooLarge as error:
        raise MLFError(f"{path}: {error}; Collage refuses such a tar (collage_core.outputs.mlf bounds it)") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as error:
        if isinstance(error, EOFError) or (opened and str(error) in TARFILE_SAYS_IT_ENDED and _at_its_end(stream)):
            raise MLFError(f"{path}: {CUT_SHORT}: it ends inside a member or its header") from None
        raise MLFError(f"{path}: not a readable tar ({type(error).__name__}: {error})") from None
    finally:
        raw.close()
    return metadata


CUT_SHORT = "the tar is cut short (not written or copied whole)"


# tarfile's words for data that ended where a header or a member's bytes were due (a PAX header's extension
# read whole, then the header it extends: a cut between the two is "empty header").
TARFILE_SAYS_IT_ENDED = ("unexpected end of data", "empty header", "truncated header")


def _at_its_end(stream: _TarStream) -> bool:
    """Whether nothing is left to read in the tar's (uncompressed) bytes."""
    stream.header_bytes_left = None
    try:
        return stream.read(1) == b""
    except (OSError, EOFError, zlib.error, lzma.LZMAError):
        return True


def _refuse_if_cut_short(path: Path, stream: _TarStream, archive: tarfile.TarFile) -> None:
    """Raise :class:`MLFError` saying so when the tar's headers stopped at the end of its data rather than at its
    end-of-archive block: a tar cut short (a copy or download that stopped) lacks members it has, and tarfile
    stops reading at the cut without a word."""
    stream.header_bytes_left = None
    stream.seek(archive.offset)
    block = stream.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE:
        raise MLFError(f"{path}: {CUT_SHORT}: it ends {archive.offset + len(block)} bytes in, inside a member or its header")


def _stream(path: Path, archive: tarfile.TarFile, info: tarfile.TarInfo, destination: Path, digest: str) -> None:
    """Copy one member to ``destination``, a chunk at a time, as a new file (never one a process has loaded)."""
    hashed = hashlib.sha256()
    partial = destination.with_name(destination.name + ".partial")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        opened = open(partial, "wb")
    except OSError as error:
        _refuse_unpacking(path, info, destination, error)
    with opened as written, archive.extractfile(info) as source:
        while chunk := source.read(READ_CHUNK):
            hashed.update(chunk)
            try:
                written.write(chunk)
            except OSError as error:
                raise MLFError(f"{path}: unpacking {info.name} into {destination.parent} failed ({error.strerror})") from None
    if hashed.hexdigest() != digest:
        partial.unlink()
        raise MLFError(f"{path}: {info.name} does not match its SHA-256 in metadata.json")
    try:
        os.replace(partial, destination)
    except OSError as error:  # a folder another member made where this one goes
        partial.unlink(missing_ok=True)
        _refuse_unpacking(path, info, destination, error)


def _refuse_unpacking(path: Path, info: tarfile.TarInfo, destination: Path, error: OSError) -> None:
    """Raise :class:`MLFError` for a member that could not be written: in one line naming the member, and the
    folder only where the file system is at fault (full, read-only), not another member's name."""
    if error.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):  # a file where this member needs a folder, or the reverse
        raise MLFError(f"{path}: {info.name} cannot be unpacked: another member of the tar is in its way ({error.strerror})") from None
    raise MLFError(f"{path}: unpacking {info.name} into {destination.parent} failed ({error.strerror})") from None


def load_mlf(path: os.PathLike, workdir: Optional[os.PathLike] = None, pm=None, strict: bool = False) -> LoadedMLF:
    """Check, link and load a Model Library Format tar written by :func:`~collage_core.outputs.mlf_export.export_mlf`; needs TVM's
    runtime and a host linker, not TVM's compiler. A tar built with other backend versions than
    those installed is loaded with a warning naming each such backend and both versions (through the
    ``collage`` logger), or with ``strict`` refused.

    Only the members metadata.json lists are read, each streamed into ``workdir`` and hashed as it is
    written; a tar over the loader's bounds (:data:`MAX_UNPACKED_BYTES`, :data:`MAX_MEMBERS`,
    :data:`MAX_HEADER_BYTES`) is refused before its members are read. Without ``workdir``, the tar is
    unpacked into a temporary folder, removed when loading fails, or else when the returned model is
    garbage collected or the process exits (what it loaded stays loaded)."""
    path = Path(path)
    made = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="collage-mlf-")) if made else Path(workdir)
    try:
        loaded = _load(path, workdir, pm, strict)
    except BaseException:
        if made:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    if made:
        weakref.finalize(loaded, shutil.rmtree, str(workdir), True)
    return loaded


def _load(path: Path, workdir: Path, pm, strict: bool) -> LoadedMLF:
    workdir.mkdir(parents=True, exist_ok=True)
    metadata = _unpack(path, workdir)
    unpacked_config = workdir / EXECUTOR_CONFIG
    _within_json_bound(path, EXECUTOR_CONFIG, unpacked_config.stat().st_size)
    config = _checked_config(path, _json(path, EXECUTOR_CONFIG, unpacked_config.read_bytes()))
    index_ranges = _input_ranges(path, config)
    objects = [str(workdir / member) for member in sorted(metadata["files"]) if member.startswith(OBJECTS_DIR)]
    library = library_file(workdir, metadata["model_name"])

    def named_by_the_tar(error) -> str:
        """The last line of an error, with the files the tar was unpacked to named as the tar and its members."""
        return _last_line(str(error)).replace(str(library), str(path)).replace(f"{workdir}{os.sep}", "")

    try:
        tvm_compat.link_shared(str(library), objects)
    except Exception as error:  # the host compiler's message in one line, without the command line TVM appends
        raise MLFError(f"{path}: linking the host code failed ({named_by_the_tar(str(error).split('Command line:')[0])})") from None
    write_runtime_file(library, config["runtime_backends"])
    try:
        device = tvm_compat.device_from_name(str(config.get("device") or "cpu"))
    except ValueError:
        raise MLFError(f"{path}: {EXECUTOR_CONFIG}: device {config['device']!r} is not one TVM knows") from None
    try:
        vm = load_vm(library, device, pm=pm, strict=strict, origin=str(path))
    except CollageError as error:
        raise MLFError(named_by_the_tar(error)) from None
    except Exception as error:  # TVM's runtime, or a backend's, refusing the library
        raise MLFError(f"{path}: the library does not load ({type(error).__name__}: {named_by_the_tar(error)})") from None
    parameters_member = _parameters_member(metadata["model_name"])
    parameters = {}
    if parameters_member in metadata["files"]:
        try:
            parameters = tvm_compat.load_params((workdir / parameters_member).read_bytes())
        except Exception as error:  # TVM's deserializer: the member matched its digest, so the exporter wrote it so
            raise MLFError(
                f"{path}: {parameters_member} is not in TVM's parameter serialization ({type(error).__name__}: {named_by_the_tar(error)})"
            ) from None
    return LoadedMLF(metadata, config, parameters, vm, library, device, index_ranges)
