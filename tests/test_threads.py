"""The thread count every backend's own pool takes: the process's cores, or fewer when asked."""

from __future__ import annotations

import os

import pytest

from collage_core.errors import CollageError
from collage_core.measure.threads import ENVIRONMENT_VARIABLE, backend_threads


def test_every_core_this_process_may_use_by_default(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    assert backend_threads() == len(os.sched_getaffinity(0))


def test_fewer_when_asked_and_never_more_than_the_cores(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    assert backend_threads() == 1
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(len(os.sched_getaffinity(0)) + 64))
    assert backend_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, value)
    with pytest.raises(CollageError, match=f"^{ENVIRONMENT_VARIABLE}='{value}' is not a positive whole number of threads$"):
        backend_threads()


def test_the_graph_level_backends_take_it(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    onnxruntime_runtime = pytest.importorskip("collage_onnxruntime.runtime")
    assert onnxruntime_runtime.session_options().intra_op_num_threads == 1
    openvino_runtime = pytest.importorskip("collage_openvino.runtime")
    assert openvino_runtime.compile_config()["INFERENCE_NUM_THREADS"] == 1
    inductor_runtime = pytest.importorskip("collage_inductor.runtime")
    assert inductor_runtime.threads() == 1
