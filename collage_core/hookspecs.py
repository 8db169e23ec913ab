"""The plugin contract: every hook a backend plugin may implement.

Each spec's docstring is the contract; docs/plugins.md repeats the signatures, types included, and
a test keeps the two in step. The types are annotations only (TVM's and the records' modules are not
imported here), so loading the specs stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    import os

    import tvm
    from tvm import relax

    from collage_core.measure.timing import MeasureSettings
    from collage_core.records import Availability, Backend, Cost, Pattern

PROJECT = "collage"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def collage_register_backends(register: Callable[[Backend], None]) -> None:
    """Register the backends this plugin provides.

    Call ``register(Backend(name, kind, device_kinds, version))`` once per backend. ``kind`` is
    ``"op-level"`` (costs of partitions add up) or ``"graph-level"`` (the backend optimises whole
    regions). Registering a name another plugin already took is an error naming both plugins.
    Return nothing.
    """


@hookspec(firstresult=True)
def collage_check_availability(backend: Backend) -> Availability | None:
    """Say whether ``backend`` can run on this machine.

    Return an ``Availability`` for backends this plugin registered, or None if ``backend`` is not
    yours. When unavailable, ``reason`` says what is missing and how to install it, in one line.
    Stops at the first non-None result.
    """


@hookspec
def collage_contribute_patterns(backend: Backend, target: tvm.target.Target, precision: str) -> list[Pattern] | None:
    """Contribute the patterns ``backend`` can run on ``target`` (a ``tvm.target.Target``).

    ``precision`` is the run's precision option (``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``; the
    graph is already converted to it). At ``"tf32"`` a backend may add float32 patterns whose kernels
    round operands to TF32, named ``<backend>.<what>_tf32`` (``dtypes.computes_tf32``); at any
    other precision it must contribute none of those. Taking the argument is optional.

    Return a list of ``Pattern`` (name ``"<backend>.<what>"``, a Relax dataflow pattern rooted
    at the group's last operator, and an optional check on the ``PatternMatch``), or None if
    ``backend`` is not yours. The results of all plugins are concatenated. Patterns are data: do
    not register them in TVM's global pattern registry.
    """


@hookspec(firstresult=True)
def collage_lower_partitions(
    backend: Backend, mod: tvm.IRModule, function_names: list[str], target: tvm.target.Target
) -> tvm.IRModule | None:
    """Lower the partitions placed on ``backend`` so that TVM's Relax build can run them.

    ``mod`` is an ``IRModule`` whose functions named in ``function_names`` hold the partitions
    (each carries the attributes ``collage.backend`` and ``collage.pattern``); ``main`` calls
    them. Return the module with those functions made buildable (left to TVM's own lowering,
    given a ``Codegen`` attribute for a ``relax.ext.<name>`` codegen, or replaced by calls to
    registered packed functions), or None if ``backend`` is not yours. Stops at the first
    non-None result.
    """


@hookspec(firstresult=True)
def collage_lower_whole_model(
    backend: Backend, model: bytes, model_format: str, func: relax.Function, name: str, target: tvm.target.Target
) -> relax.Function | None:
    """Run the whole model file the user gave Collage in ``backend``'s own session, as its users run it.

    Optional, for engines that read model files (ONNX Runtime, OpenVINO). ``model`` is the file's
    bytes, in ``model_format`` (``"onnx"``); ``func`` is the imported model's ``main`` as a partition
    (named ``name``, carrying the attributes ``collage.backend`` and ``collage.pattern``): its
    parameters are the file's inputs and it returns the file's outputs, in the file's order. Return
    a ``relax.Function`` with ``func``'s parameters, return type and attributes whose body runs
    ``model`` in the engine's default session with ``collage_core.measure.threads.backend_threads()``
    threads (usually ``R.call_dps_packed`` of the function your partitions call, the bytes packed as
    a constant), or None if ``backend`` is not yours or does not run this format on ``target``.
    Called in the process that holds the file; the function it returns runs in any process where
    ``collage_prepare_runtime(backend)`` answered. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def collage_measure_candidate(backend: Backend, mod: tvm.IRModule, target: tvm.target.Target, settings: MeasureSettings) -> Cost | None:
    """Measure the latency of ``mod["main"]`` (one candidate, standalone) on ``backend``.

    Optional: the core's default measurement lowers the candidate as one partition, builds it
    with TVM and times it on the device of ``target``. ``settings`` is a
    ``MeasureSettings`` (warm-up, repeat limits, time bound); when its ``cutoff_s`` is set, the
    operators have a known way ten times faster, and a run after the warm-up that takes longer may
    be the cost (``repeats`` 1) without timing more. Return a ``Cost`` (``measured`` with
    median and spread in seconds, or ``invalid`` with the reason), or None to leave the
    measurement to the next implementation. Runs in a measurement worker process. Stops at the
    first non-None result.
    """


@hookspec(firstresult=True)
def collage_tune_partitions(
    backend: Backend, mod: tvm.IRModule, function_names: list[str], target: tvm.target.Target, budget_s: float
) -> int | None:
    """Tune kernels for ``backend`` from the partitions named in ``function_names``, for at most ``budget_s`` seconds.

    Optional, for backends whose kernels get faster by tuning on the device; called after the search when the
    user gives a tuning budget, once per chosen backend in turn. ``mod`` is the placement's module as
    ``collage_lower_partitions`` receives it; ``function_names`` are its op-level partitions, of every backend,
    the most costly first by measured share of the placement. Tune those your backend can run better, keeping
    what is tuned where later runs on this device find it, and say one line per tuned kernel on stderr. Change
    ``backend``'s version when what it keeps changes: costs measured before are no longer its own. Return the
    number of kernels tuned in this call, or None if ``backend`` is not yours; when any backend tuned one, the
    core registers the backends anew and searches again. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def collage_prepare_runtime(backend: Backend) -> bool | None:
    """Make what ``backend``'s lowered partitions call available in this process.

    Called before a library holding ``backend``'s partitions is loaded in a process that did not
    build it: register the packed functions the partitions call, load native libraries. Return
    True when the process is ready, or None if ``backend`` is not yours. Raise with a message
    saying what to install when it cannot be done. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def collage_runtime_libraries(backend: Backend) -> list[str | os.PathLike] | None:
    """The native shared libraries whose loading, in order, registers every function ``backend``'s
    lowered partitions call, so that an exported library runs without the plugin.

    Optional. Exports (the optimized library and Model Library Format) carry copies of them, and
    a process with TVM's runtime alone (no compiler, no plugins) loads the copies instead of
    asking ``collage_prepare_runtime``. Return a list of paths (empty when TVM compiles the
    partitions into the library itself), or None when ``backend`` is not yours or its partitions
    need the plugin at run time (Python on the call path). May build the libraries on this
    machine; must not need a GPU. Stops at the first non-None result.
    """
