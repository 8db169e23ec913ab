"""A PyTorch module optimized for several shapes: exported once to ONNX with the listed dimensions symbolic.

A module has no named dimensions, so its shapes are listed by input, every tensor argument of ``forward`` given
(``"x=1x3x224x224,8x3x224x224"``; several inputs: the k-th shape of each makes shape k). An axis whose size
differs from the example input's in some listed shape becomes a symbolic dimension named ``INPUT.AXIS``
(``x.0``); axes of several inputs whose sizes agree in the example and in every listed shape are one dimension
(a mask's batch and sequence are its token ids'), so that they are padded together. The module is exported by
the TorchScript ONNX exporter (a trace: branches on input values follow the example inputs) with those axes
dynamic, and the export is checked against the module at every listed shape before anything is measured; the
shapes then run as for an ONNX file, ONNX Runtime on the export being the reference, as the check showed it may.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from collage_core.errors import one_line
from collage_core.model.model_import import as_array, as_tensor
from collage_core.model.shape_profiles import ShapeProfileError, SymbolicInput, parse_shapes
from collage_core.model.torch_onnx import export_flattened, in_eval_mode
from collage_core.model.torch_outputs import Flattened, forward_input_names
from collage_core.model.verify import DEFAULT_ATOL, DEFAULT_RTOL


def exported_for_shapes(module: Any, example_inputs: Sequence[Any], text: str):
    """``module`` as an ``onnx.ModelProto`` whose dimensions ``text`` varies are symbolic (see the module's
    docstring), checked against the module at each shape listed; or a one-line :class:`ShapeProfileError`."""
    # Deferred: PyTorch and ONNX are optional: loaded only for a PyTorch module.
    import onnx
    import torch

    name = type(module).__name__
    if example_inputs is None or not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise ShapeProfileError(f"PyTorch module {name}: shapes need example_inputs, a tuple of tensors (one per input of forward)")
    names = forward_input_names(module, len(example_inputs))
    free = [SymbolicInput(n, tuple(f"{n}.{axis}" for axis in range(x.dim())), _dtype(x)) for n, x in zip(names, example_inputs)]
    try:
        profiles = parse_shapes(text, free)
    except ShapeProfileError as error:
        raise ShapeProfileError(
            f"PyTorch module {name}: {error}; a module's dimensions have no names: list every input's shapes, "
            f"e.g. {_example(names, example_inputs)}"
        ) from None
    example = {n: tuple(x.shape) for n, x in zip(names, example_inputs)}
    # Each axis's sizes: the example's first, then each shape's. Axes whose sizes vary become dimensions; those
    # with equal sizes everywhere are one.
    sizes_of = {(n, axis): (example[n][axis], *(p.shape_of(n)[axis] for p in profiles)) for n in names for axis in range(len(example[n]))}
    dims: dict[tuple, str] = {}
    axes: dict[str, dict[int, str]] = {n: {} for n in names}
    for (n, axis), sizes in sizes_of.items():
        if len(set(sizes)) > 1:
            axes[n][axis] = dims.setdefault(sizes, f"{n}.{axis}")
    if not dims:
        raise ShapeProfileError(f"PyTorch module {name}: every shape listed is the example's: optimize it without shapes")
    with in_eval_mode(module, name):
        flat = Flattened(module).eval()  # its tensors in the order a single shape's import takes them
        try:
            data = export_flattened(flat, example_inputs, names, {n: a for n, a in axes.items() if a})
            proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(data))
        except Exception as error:  # noqa: BLE001 - one line naming the module
            raise ShapeProfileError(
                f"PyTorch module {name}: the ONNX export with dynamic {', '.join(dims.values())} failed: {one_line(error)}"
            ) from None
        proto.graph.name = name
        _check_export(flat, proto, names, profiles, example_inputs, name)
    return proto


def _dtype(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _example(names, example_inputs) -> str:
    shapes = ["x".join(str(s) for s in x.shape) for x in example_inputs]
    return " ".join(f"{n}={s},{'x'.join(['8', *s.split('x')[1:]]) if 'x' in s else '8'}" for n, s in zip(names, shapes))


def _check_export(module, proto, names, profiles, example_inputs, name: str) -> None:
    """The export computes what the module (:class:`Flattened`) does at every shape listed (ONNX Runtime against PyTorch, fp32's
    tolerance, NaN where both give NaN), inputs drawn as the example's: integers within the example's range,
    floats from a normal; else one line naming the shape."""
    # Deferred: ONNX Runtime and PyTorch are optional and slow to import: loaded only for a PyTorch module.
    import onnxruntime
    import torch

    kept = [value.name for value in proto.graph.input]
    unused = [n for n in names if n not in kept]
    if unused:
        raise ShapeProfileError(
            f"PyTorch module {name}: forward does not use its input(s) {', '.join(unused)}, which the export drops: "
            "leave them out of example_inputs"
        )
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for profile in profiles:
        arrays = []
        for n, x in zip(names, example_inputs):
            shape = profile.shape_of(n)
            if x.dtype.is_floating_point:
                arrays.append(rng.standard_normal(shape).astype(_dtype(x)))
            else:
                low, high = int(x.min()), int(x.max())
                arrays.append(rng.integers(low, high + 1, shape).astype(_dtype(x)) if high > low else np.full(shape, low, _dtype(x)))
        try:
            with torch.no_grad():
                expected = [as_array(t, torch) for t in module(*(as_tensor(a, torch) for a in arrays))]
        except Exception as error:  # noqa: BLE001 - one line naming the shape
            raise ShapeProfileError(f"PyTorch module {name} fails at {_shown(profile)}: {one_line(error)}") from None
        try:
            got = session.run(None, dict(zip(names, arrays)))
        except Exception as error:  # noqa: BLE001 - one line naming the shape
            got, why = None, f"ONNX Runtime fails on it ({one_line(error)})"
        if got is not None and len(got) != len(expected):
            why = f"it has {len(got)} outputs, the module {len(expected)}"
        elif got is not None:
            wrong = [
                i
                for i, (want, have) in enumerate(zip(expected, got))
                if want.shape != have.shape or not np.allclose(have, want, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, equal_nan=True)
            ]
            if not wrong:
                continue
            why = f"output {wrong[0]} differs"
        raise ShapeProfileError(
            f"PyTorch module {name}: its ONNX export does not compute what it does at {_shown(profile)}: {why} "
            "(the trace followed the example inputs; export the module yourself with those dimensions dynamic)"
        )


def _shown(profile) -> str:
    return " ".join(f"{n}={'x'.join(map(str, s))}" for n, s in profile.shapes)
