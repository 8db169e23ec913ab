"""The end of a run kept beside its library, so that the same command run again reuses it.

After the search, ``optimize`` builds the placement, verifies it, measures the baselines and times
the closest of them in turns: on a warm cost database that tail is nearly all a rerun costs. The
output directory keeps its outcome in ``finished.json``, keyed by everything that could change it
(the model, the target, the backends and their versions, the searched placement, the settings and
Collage's code, part by part) and tied to the library it describes (its size, modification time and
SHA-256: a library of the same size and time but other bytes is not the one that was verified). When a
later run reaches the same searched placement with the same key and the library is untouched, the
library, the placement it returned, the verification and the end-to-end rows are reused; otherwise the
lookup says which part differed, so that a slow rerun says why it was slow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import attrs

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.measure.in_turns import WARM
from collage_core.measure.job import FINISHED_PROTOCOL, Job
from collage_core.model.verify import Verification
from collage_core.outputs.end_to_end import EndToEnd
from collage_core.outputs.output_folder import write_text
from collage_core.outputs.placement_file import Placement, placement_from_json

if TYPE_CHECKING:  # a job and the options are what a run's key is made of, never made here
    from collage_core.options import OptimizeOptions

log = logging.getLogger("collage")

FILE_NAME = "finished.json"
FORMAT = "collage-finished-build"
# 2: the key kept part by part; rows say whether they were timed in turns; the search's placement
# kept when a baseline won the contest. 3: the library's SHA-256.
VERSION = 3


@attrs.frozen
class FinishKey:
    """Everything a run's end depends on, part by part, so that a mismatch can be named."""

    model: str  # the imported model's fingerprint
    target: str
    backends: dict  # name -> version
    searched: str  # the searched placement's end-to-end key
    settings: dict
    code: str  # code_digest of Collage and the plugins in use

    def to_json(self) -> dict:
        """As kept in ``finished.json`` (JSON's own types, so that a key read back compares equal)."""
        return json.loads(json.dumps(attrs.asdict(self)))

    def differences(self, kept: dict) -> list[str]:
        """What differs between this key and ``kept`` (a key's JSON), in words; the searched placement
        only when nothing before it does (its key covers the model, the target and the backends)."""
        mine = self.to_json()
        changed = {name for name in mine if kept.get(name) != mine[name]}
        said = []
        if "model" in changed:
            said.append("the model changed")
        if "target" in changed:
            said.append(f"another target (was {kept.get('target')})")
        if "backends" in changed:
            said.append(f"other backends or versions (was {_versions(kept.get('backends'))}, now {_versions(self.backends)})")
        if "settings" in changed:
            said.append(f"other settings ({', '.join(_changed_settings(kept.get('settings'), mine['settings']))})")
        if "code" in changed:
            said.append("Collage's code or a plugin's changed")
        if not said and "searched" in changed:
            said.append("the search ended at another placement")
        return said


def _versions(backends) -> str:
    if not isinstance(backends, dict):
        return "unknown"
    return ", ".join(f"{name} {version}" for name, version in sorted(backends.items()))


def _changed_settings(kept, mine: dict) -> list[str]:
    """The names of the settings that differ, one level into nested settings (``settings.single_run_s``)."""
    kept = kept if isinstance(kept, dict) else {}
    changed = []
    for name in sorted(set(kept) | set(mine)):
        before, now = kept.get(name), mine.get(name)
        if before == now:
            continue
        if isinstance(before, dict) and isinstance(now, dict):
            changed += [f"{name}.{inner}" for inner in sorted(set(before) | set(now)) if before.get(inner) != now.get(inner)]
        else:
            changed.append(name)
    return changed


@attrs.frozen
class FinishedBuild:
    """What a run ended with: the placement it returned, its end-to-end rows and its verification,
    and the search's own placement when a baseline won the contest and was returned instead."""

    key: FinishKey
    placement: Placement = attrs.field(eq=False)
    end_to_end: list = attrs.field(eq=False)
    verification: Optional[Verification]
    searched_placement: Optional[Placement] = attrs.field(default=None, eq=False)


@attrs.frozen
class Lookup:
    """The run end kept in a directory, if it can be reused; else why not ("": nothing was kept)."""

    finished: Optional[FinishedBuild] = None
    why_not: str = ""


def finish_key(searched_key: str, settings: dict, code_modules) -> str:
    """The key of a run's end: the searched placement's key, every setting that changes what follows,
    and the source of Collage's core and of ``code_modules`` (the plugins in use)."""
    text = json.dumps({"searched": searched_key, "settings": settings, "code": code_digest(code_modules)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def code_digest(module_names) -> str:
    """A digest of the Python source of ``collage_core`` and of the packages of ``module_names``."""
    digest = hashlib.sha256()
    roots = {Path(__file__).resolve().parent.parent}  # collage_core
    for name in module_names:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            roots.add(Path(module.__file__).resolve().parent)
    for root in sorted(roots):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def save_finished(directory: os.PathLike, library: os.PathLike, finished: FinishedBuild) -> Path:
    """Write ``finished.json`` into ``directory``, tied to ``library`` as it is now."""
    stat = Path(library).stat()
    record = {
        "format": FORMAT,
        "version": VERSION,
        "key": finished.key.to_json(),
        "library": {"name": Path(library).name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(library)},
        "placement": finished.placement.to_json(),
        "searched_placement": None if finished.searched_placement is None else finished.searched_placement.to_json(),
        "end_to_end": [row.to_json() for row in finished.end_to_end],
        "verification": None if finished.verification is None else attrs.asdict(finished.verification),
    }
    return write_text(Path(directory) / FILE_NAME, json.dumps(record, indent=1, sort_keys=True) + "\n")


def load_finished(directory: os.PathLike, library: os.PathLike, key: FinishKey) -> Lookup:
    """The run end kept in ``directory`` if it has ``key`` and ``library`` is the one it describes;
    else why not, in words (nothing when no record is kept).

    A record that is unreadable, of another key or of a changed library is not reused (and is
    overwritten when this run ends); nothing is raised.
    """
    path = Path(directory) / FILE_NAME
    try:
        record = json.loads(path.read_text())
        if record.get("format") != FORMAT or record.get("version") != VERSION:
            return Lookup(why_not=f"{path.name} was written by another version of Collage")
        differences = key.differences(record.get("key") if isinstance(record.get("key"), dict) else {})
        if differences:
            return Lookup(why_not="; ".join(differences))
        kept = record["library"]
        try:
            stat = Path(library).stat()
        except FileNotFoundError:
            return Lookup(why_not=f"its library {Path(library).name} is missing")
        if (kept["name"], kept["size"], kept["mtime_ns"]) != (Path(library).name, stat.st_size, stat.st_mtime_ns):
            return Lookup(
                why_not=f"its library {Path(library).name} was written again after it ended (by another run into the same directory?)"
            )
        if kept["sha256"] != _sha256(library):
            return Lookup(
                why_not=f"its library {Path(library).name} has other bytes than the one it ended with "
                "(its SHA-256 differs, though its size and time do not)"
            )
        rows = [EndToEnd.from_json(row) for row in record["end_to_end"]]
        verification = None if record["verification"] is None else Verification(**record["verification"])
        placement = placement_from_json(record["placement"], str(path))
        searched = record.get("searched_placement")
        searched = None if searched is None else placement_from_json(searched, str(path))
    except FileNotFoundError:
        return Lookup()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CollageError) as error:
        log.warning("%s: not reused (%s: %s)", path, type(error).__name__, error)
        return Lookup(why_not=f"{path.name} could not be read ({type(error).__name__})")
    return Lookup(FinishedBuild(key, placement, rows, verification, searched))


def _sha256(path: os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def key_of_run(job: Job, parts, options: "OptimizeOptions") -> FinishKey:
    """The key the end of ``job``'s run from the searched ``parts`` is kept under: its model, target,
    backends, searched placement, the options that change what follows, and the code."""
    settings = {
        "accuracy_budget": options.accuracy_budget,
        "compare_backends": options.compares_backends(),
        "baseline_limit_s": options.baseline_limit_s,
        "verify": options.verify,
        "reference": job.imported.reference_name,
        "settings": attrs.evolve(options.settings, build_workers=0).to_json(),
    }
    if options.rpc_key is not None:  # verified and timed on those servers, not here (and the reverse)
        settings["rpc_key"] = options.rpc_key
    if options.latency != WARM:  # the contest chose by another figure (warm runs' keys stay as they were)
        settings["latency"] = options.latency
    return FinishKey(
        model=job.imported.fingerprint,
        target=tvm_compat.target_to_json(job.target),
        backends={name: backend.version for name, backend in sorted(job.backends.items())},
        searched=job.end_to_end_key(parts, FINISHED_PROTOCOL),
        settings=settings,
        code=code_digest(job.plugin_modules),
    )


def run_before(directory: Path, library: Path, key: FinishKey, say, remeasure_held_up: bool = False) -> Optional[FinishedBuild]:
    """The end of the run before in ``directory`` when it can be reused under ``key``, and, with ``remeasure_held_up``,
    none of its latencies was timed held up by other processes; says why it cannot."""
    kept = load_finished(directory, library, key)
    if remeasure_held_up and kept.finished is not None and any(row.cost.held_up for row in kept.finished.end_to_end):
        kept = attrs.evolve(
            kept,
            finished=None,
            why_not="some of its latencies were timed while other processes kept the processors busy (--remeasure-held-up)",
        )
    if kept.why_not:
        say(f"the run before in {directory} is not reused: {kept.why_not}")
    if kept.finished is not None:
        say(
            f"the run before in {directory} ended from this same searched placement (same model, target, backends, "
            f"settings and code): its library, verification and end-to-end measurements are reused"
        )
    return kept.finished
