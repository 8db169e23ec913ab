"""Hostile Model Library Format tars: ``load_mlf`` refuses each in one line naming the tar, reading only
the members metadata.json lists, a chunk at a time, and no tar past its bounds.

The tars are made here, small and quick to write: a tar that looks like an export (metadata.json
listing the executor configuration, the placement, the Relax text and one object file) with one
thing made hostile. Those that would take memory from a loader reading what tars declare are loaded
in a new process whose address space is held to what it has plus 200 MiB, so that such a loader
ends there in ``MemoryError`` instead of taking the machine's memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from collage_core.outputs import mlf
from collage_core.outputs.mlf import MLFError, load_mlf

CONFIG = {
    "executor": "relax-vm",
    "entry": "main",
    "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
    "outputs": [{"name": "y", "shape": [1, 4], "dtype": "float32"}],
    "device": "cpu",
    "runtime_backends": {},
    "parameters_embedded": True,
}
MEMBERS = {
    "executor-config/relax-vm.json": json.dumps(CONFIG).encode(),
    "placement.json": b"{}",
    "src/relax.txt": b"# relax\n",
    "codegen/host/lib/lib0.o": b"not an object file",
}
HEADROOM = 200 * 2**20


def metadata_for(listed: dict[str, bytes], /, **changes) -> bytes:
    metadata = {
        "format": "collage-model-library-format",
        "version": 1,
        "model_name": "m",
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in listed.items()},
        "sizes": {name: len(data) for name, data in listed.items()},
    }
    metadata.update(changes)
    return json.dumps(metadata).encode()


def write_tar(path: Path, members: dict[str, bytes], *, extra: bytes = b"", compress: bool = False) -> Path:
    """A tar of ``members`` (name -> bytes, or name -> (size, reader) for large ones), then the raw ``extra`` blocks."""
    opened = gzip.open(path, "wb", compresslevel=1) if compress else open(path, "wb")
    with opened as out:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                size, reader = (len(data), io.BytesIO(data)) if isinstance(data, bytes) else data
                info.size = size
                archive.addfile(info, reader)
            archive.fileobj.write(extra)
    return path


def export_like(path: Path, replaced: dict[str, bytes] = None, **metadata_changes) -> Path:
    """A tar laid out as an export, ``replaced`` members swapped in and listed with their digests and sizes."""
    files = {**MEMBERS, **(replaced or {})}
    return write_tar(path, {"metadata.json": metadata_for(files, **metadata_changes), **files})


def raw_header(name: str, size: int, kind: bytes) -> bytes:
    """One 512-byte tar header of ``kind`` declaring ``size`` bytes (GNU base-256 numbers: sizes past 8 GiB)."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def sparse_header(name: str, declared: int, stored: int) -> bytes:
    """An old-style GNU sparse member: ``stored`` bytes in the tar, ``declared`` (zeros past them) once read."""
    block = bytearray(raw_header(name, stored, tarfile.REGTYPE))
    block[156:157] = tarfile.GNUTYPE_SPARSE
    block[386:410] = tarfile.itn(0, 12, tarfile.GNU_FORMAT) + tarfile.itn(stored, 12, tarfile.GNU_FORMAT)
    block[482:483] = b"\0"
    block[483:495] = tarfile.itn(declared, 12, tarfile.GNU_FORMAT)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read without holding them."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def refused_in_one_line(tar: Path) -> str:
    with pytest.raises(MLFError) as refused:
        load_mlf(tar, tar.parent / "unpacked")
    message = str(refused.value)
    assert message.startswith(f"{tar}: ") and "\n" not in message
    return message.removeprefix(f"{tar}: ")


LOAD_UNDER_A_MEMORY_BOUND = """
import resource, sys
from collage_core.outputs.mlf import load_mlf
from collage_core.errors import CollageError
with open("/proc/self/statm") as statm:
    held = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (held + int(sys.argv[1]), resource.RLIM_INFINITY))
for tar in sys.argv[2:]:
    try:
        load_mlf(tar, tar + ".unpacked")
        print("loaded")
    except CollageError as error:
        print(f"refused: {error}")
    except MemoryError:
        print("MemoryError")
"""


def test_tars_declaring_more_than_memory_holds_are_refused_without_reading_it(tmp_path):
    listed_large = dict(MEMBERS, **{"codegen/host/lib/lib0.o": (300 * 2**20, Zeros(300 * 2**20))})
    metadata = metadata_for(MEMBERS, sizes={})  # lists lib0.o with its small digest: the large one must not match
    bounded = "; Collage refuses such a tar (collage_core.outputs.mlf bounds it)"
    tars = {
        write_tar(
            tmp_path / "sparse.tar", {}, extra=sparse_header("metadata.json", 64 * 2**30, 512) + bytes(512)
        ): f"its members unpack to more than 16 GiB{bounded}",
        write_tar(
            tmp_path / "pax.tar", {}, extra=raw_header("././@PaxHeader", 64 * 2**30, tarfile.XHDTYPE) + bytes(10240)
        ): f"its headers take more than 256 MiB{bounded}",
        write_tar(
            tmp_path / "long-name.tar", {}, extra=raw_header("././@LongLink", 64 * 2**30, tarfile.GNUTYPE_LONGNAME) + bytes(10240)
        ): f"its headers take more than 256 MiB{bounded}",
        write_tar(
            tmp_path / "unlisted.tar.gz",
            {
                "metadata.json": metadata_for(
                    MEMBERS, files=dict(json.loads(metadata_for(MEMBERS))["files"], **{"placement.json": "0" * 64})
                ),
                "unlisted.bin": (300 * 2**20, Zeros(300 * 2**20)),
                **MEMBERS,
            },
            compress=True,
        ): "placement.json does not match its SHA-256 in metadata.json",
        write_tar(
            tmp_path / "listed.tar.gz", {"metadata.json": metadata, **listed_large}, compress=True
        ): "codegen/host/lib/lib0.o does not match its SHA-256 in metadata.json",
    }
    assert all(path.stat().st_size < 2 * 2**20 for path in tars)
    run = subprocess.run(
        [sys.executable, "-c", LOAD_UNDER_A_MEMORY_BOUND, str(HEADROOM), *map(str, tars)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [f"refused: {path}: {message}" for path, message in tars.items()]
    assert not list((tmp_path / "listed.tar.gz.unpacked").rglob("*.partial"))


def test_a_member_of_another_size_than_metadata_declares_is_refused_before_it_is_read(tmp_path):
    tar = export_like(tmp_path / "m.tar", sizes={**{name: len(data) for name, data in MEMBERS.items()}, "placement.json": 1})
    assert refused_in_one_line(tar) == "placement.json is 2 bytes in the tar, and metadata.json declares 1"


def broken_config(text: bytes) -> dict:
    return {"executor-config/relax-vm.json": text}


@pytest.mark.parametrize(
    "replaced, metadata, message",
    [
        (broken_config(b'{"executor": "relax-vm",'), {}, "executor-config/relax-vm.json is not JSON (Expecting"),
        (broken_config(b"[" * 100_000 + b"]" * 100_000), {}, "executor-config/relax-vm.json is not JSON Collage reads (nested too deeply)"),
        (broken_config(b"[1, 2]"), {}, "executor-config/relax-vm.json: a JSON object is wanted, not list"),
        (
            broken_config(json.dumps({k: v for k, v in CONFIG.items() if k != "runtime_backends"}).encode()),
            {},
            "executor-config/relax-vm.json: runtime_backends must map each backend to what it needs",
        ),
        (
            broken_config(json.dumps(dict(CONFIG, inputs=[{"name": "x", "shape": [-1], "dtype": "float32"}])).encode()),
            {},
            "executor-config/relax-vm.json: inputs must list each tensor's name, shape (non-negative integers) and dtype",
        ),
        (
            broken_config(json.dumps(dict(CONFIG, outputs=[{"name": "y", "shape": [1], "dtype": "no such type"}])).encode()),
            {},
            "executor-config/relax-vm.json: outputs must list each tensor's name, shape (non-negative integers) and dtype",
        ),
        (
            broken_config(json.dumps(dict(CONFIG, input_ranges=[{"input": 0, "low": "none"}])).encode()),
            {},
            "executor-config/relax-vm.json: input_ranges must list each input's index, name, low and high",
        ),
        ({}, {"model_name": None}, "model name None in metadata.json is not a name"),
        ({}, {"files": {"placement.json": 7}}, "metadata.json's files must map each member to its SHA-256 as text"),
        ({}, {"sizes": {"placement.json": "two"}}, "metadata.json's sizes must map members to their sizes in bytes"),
        ({"../escape.txt": b"x"}, {}, "member ../escape.txt points outside the tar"),
    ],
    ids=[
        "config-not-json",
        "config-nested-deeply",
        "config-not-an-object",
        "config-without-runtime-backends",
        "config-negative-shape",
        "config-unknown-dtype",
        "config-spoilt-input-ranges",
        "metadata-without-model-name",
        "metadata-digest-not-text",
        "metadata-size-not-a-number",
        "member-outside",
    ],
)
def test_tars_whose_digests_were_recomputed_over_bad_contents_are_refused_in_one_line(tmp_path, replaced, metadata, message):
    tar = export_like(tmp_path / "m.tar", replaced, **metadata)
    assert refused_in_one_line(tar).startswith(message)
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize(
    "metadata, message",
    [
        (b"[" * 100_000 + b"]" * 100_000, "metadata.json is not JSON Collage reads (nested too deeply)"),
        (b"[1]", "metadata.json is not Collage's Model Library Format (a JSON list, not an object)"),
    ],
    ids=["nested-deeply", "not-an-object"],
)
def test_bad_metadata_is_refused_in_one_line(tmp_path, metadata, message):
    tar = write_tar(tmp_path / "m.tar", {"metadata.json": metadata, **MEMBERS})
    assert refused_in_one_line(tar) == message


def test_a_member_twice_in_the_tar_is_refused(tmp_path):
    files = dict(MEMBERS)
    tar = tmp_path / "m.tar"
    with tarfile.open(tar, "w") as archive:
        for name, data in [("metadata.json", metadata_for(files)), *files.items(), ("placement.json", b"[]")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    assert refused_in_one_line(tar) == "placement.json is in the tar twice"


def test_too_many_members_are_refused_from_the_headers(tmp_path, monkeypatch):
    monkeypatch.setattr(mlf, "MAX_MEMBERS", 3)
    tar = export_like(tmp_path / "m.tar")
    assert refused_in_one_line(tar) == ("it has more than 3 members; Collage refuses such a tar (collage_core.outputs.mlf bounds it)")


def test_a_failed_load_leaves_no_folder_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(mlf.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tar = export_like(tmp_path / "m.tar")  # refused once unpacked: its object file does not link
    with pytest.raises(MLFError, match="linking the host code failed"):
        load_mlf(tar)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_tar_cut_short_is_refused_as_cut_short_wherever_the_cut_falls(tmp_path):
    """A copy that stopped midway: inside the metadata, inside a later member's header (tarfile then stops reading
    without a word, and the members after it looked missing), inside a member's data, inside a gzip stream."""
    whole = export_like(tmp_path / "whole.tar").read_bytes()
    with tarfile.open(tmp_path / "whole.tar") as archive:
        members = archive.getmembers()
    cut_tars = {
        "in the metadata": whole[: members[0].offset_data + 10],
        "in a later header": whole[: members[2].offset + 100],
        "in a member's data": whole[: members[3].offset_data + 4],
    }
    compressed = gzip.compress(whole)
    cut_tars["in a gzip stream"] = compressed[: len(compressed) // 2]
    for index, (where, data) in enumerate(cut_tars.items()):
        tar = tmp_path / f"cut-{index}.tar"
        tar.write_bytes(data)
        assert refused_in_one_line(tar).startswith(mlf.CUT_SHORT), where


@pytest.mark.parametrize("file_first", [True, False], ids=["file-then-member-under-it", "member-under-it-then-file"])
def test_a_member_whose_folder_is_another_member_is_refused_naming_it_not_the_work_folder(tmp_path, file_first):
    """src/relax.txt is a file, and src/relax.txt/inner needs it to be a folder: whichever the tar holds first,
    the other cannot be written."""
    files = {**MEMBERS, "src/relax.txt/inner": b"x"}
    ordered = dict(sorted(files.items(), key=lambda item: item[0] != ("src/relax.txt" if file_first else "src/relax.txt/inner")))
    tar = write_tar(tmp_path / "m.tar", {"metadata.json": metadata_for(files), **ordered})
    message = refused_in_one_line(tar)
    blocked = "src/relax.txt/inner" if file_first else "src/relax.txt"
    assert message.startswith(f"{blocked} cannot be unpacked: another member of the tar is in its way")
    assert str(tmp_path / "unpacked") not in message


def test_a_tar_cut_inside_a_pax_header_is_refused_as_cut_short(tmp_path):
    """The export writes PAX headers, and a member's long or non-ASCII name (the parameters carry the model's) takes
    an extension before its header: cut between the two, tarfile says "empty header"."""
    files = {**MEMBERS, "parameters/" + "m" * 120 + ".params": b"p" * 100}
    whole = tmp_path / "whole.tar"
    with tarfile.open(whole, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in [("metadata.json", metadata_for(files)), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with tarfile.open(whole) as archive:
        long_named = next(info for info in archive.getmembers() if info.name.startswith("parameters/"))
    tar = tmp_path / "cut.tar"
    tar.write_bytes(whole.read_bytes()[: long_named.offset_data - 512 + 100])  # past the extension, inside the header
    assert refused_in_one_line(tar).startswith(mlf.CUT_SHORT)
