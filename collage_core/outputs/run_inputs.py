"""The arrays a call of a built model is given, checked against what its library takes before anything runs.

TVM's virtual machine refuses a call with too few or too many inputs, or an input of another type or shape, deep in
the call and in its own words (``Check failed: ... (2 vs. 1)``, ``match_cast error``, ``expect Tensor with dtype int64
but get int32``). :func:`checked_inputs` says it in one line naming the input and what the model takes, and casts
nothing: a cast the caller did not ask for could change the numbers (int64 token ids cut to int32) or hide a mix-up.
A library of several shapes (:mod:`collage_core.outputs.dispatch`) chooses by the inputs' shapes, so only their
number and types are checked here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import attrs
import numpy as np

from collage_core.errors import CollageError


class InputMismatch(CollageError):
    """A call's inputs are not what the model takes: their number, an input's type or its shape."""


@attrs.frozen
class Expected:
    """What the library takes as one input: its name, type and shape (None: any shape, the dispatcher chooses)."""

    name: str
    dtype: str
    shape: Optional[tuple[int, ...]] = attrs.field(default=None, converter=lambda s: None if s is None else tuple(int(d) for d in s))


def checked_inputs(expected: Sequence[Expected], inputs: Sequence) -> list[np.ndarray]:
    """``inputs`` as numpy arrays, once each is what ``expected`` says the model takes; else one line
    (:class:`InputMismatch`) naming the first that is not."""
    names = ", ".join(f"{spec.name} ({_shown(spec)})" for spec in expected)
    if len(inputs) != len(expected):
        given = f"{len(inputs)} input{'s' if len(inputs) != 1 else ''}"
        raise InputMismatch(f"{given} given; the model takes {len(expected)}: {names}; nothing was run")
    arrays = [np.asarray(_detached(array)) for array in inputs]
    for spec, array in zip(expected, arrays):
        if str(array.dtype) != spec.dtype:
            raise InputMismatch(
                f"input {spec.name}: {array.dtype} values where the model takes {spec.dtype} "
                f"(np.asarray(x, {spec.dtype!r}) casts them); nothing was run"
            )
        if spec.shape is not None and tuple(array.shape) != spec.shape:
            raise InputMismatch(f"input {spec.name}: shape {tuple(array.shape)} where the model takes {spec.shape}; nothing was run")
    return arrays


def _shown(spec: Expected) -> str:
    return spec.dtype if spec.shape is None else f"{spec.dtype} {'x'.join(map(str, spec.shape)) or 'scalar'}"


def _detached(value):
    """A PyTorch tensor that takes part in autograd (``requires_grad``) without its graph, as numpy reads it; anything
    else as it is. Inference reads the values only."""
    detach = getattr(value, "detach", None)
    return detach() if callable(detach) and getattr(value, "requires_grad", False) else value
