"""The result table: each end-to-end row against the fastest other build timed the same way."""

from __future__ import annotations

from types import SimpleNamespace

from collage_core.records import Cost
from collage_core.report import render_report
from collage_core.result import EndToEnd


def _row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(name + "  "))
    return line[len(name):].split()


def test_a_library_is_compared_with_other_builds_timed_the_same_way_never_with_itself():
    mix, alone = {"cublas": 240, "tvm": 175}, {"tvm": 415}
    entries = [
        EndToEnd("placement", Cost.measured(1.8e-3, 1e-6, 5), mix),
        EndToEnd("tvm alone", Cost.measured(5.4e-3, 1e-6, 5), alone),
        EndToEnd("cublas + tvm for the rest", Cost.measured(1.7e-3, 1e-6, 5), mix),  # the same library as the placement
        EndToEnd("placement, timed in turns", Cost.measured(2.0e-3, 1e-4, 99), mix),
        EndToEnd("tvm alone, timed in turns", Cost.measured(4.0e-3, 1e-4, 99), alone),
    ]
    placement = SimpleNamespace(partitions=[], model_name="m", operators=[0] * 415, device="cuda:sm_90a", search="op-level", ran_on="", precision="fp32")
    text = render_report(SimpleNamespace(placement=placement, end_to_end=entries, measurement=None, two_level=None, verification=None, phases_s={}))
    assert "vs best other build" in text
    assert _row(text, "placement")[3] == "0.333"  # 1.8 against tvm alone's 5.4, not against its own 1.7
    assert _row(text, "tvm alone")[3] == "3.176"  # 5.4 against the mix's fastest, 1.7
    assert _row(text, "placement, timed in turns")[3] == "0.500"  # in turns against in turns: 2.0 / 4.0


def test_the_report_gives_what_cuda_graphs_gained_when_the_placement_was_measured_both_ways():
    mix = {"cublas": 240, "tvm": 175}
    placement = SimpleNamespace(partitions=[], model_name="m", operators=[0] * 415, device="cuda:sm_90a", search="op-level", ran_on="", precision="fp32")

    def report(entries):
        return render_report(SimpleNamespace(placement=placement, end_to_end=entries, measurement=None, two_level=None,
                                             verification=None, phases_s={}))

    graphs = EndToEnd("placement", Cost.measured(1.5e-3, 1e-6, 5), mix)
    launched = EndToEnd("placement without CUDA graphs", Cost.measured(2.4e-3, 1e-6, 5), mix)
    text = report([graphs, launched])
    assert "CUDA graphs: 1.500 ms replayed as graphs, 2.400 ms launching kernel by kernel (1.60x)" in text
    assert _row(text, "placement without CUDA graphs")[3] == "-"  # the same mix: not another build to compare with
    assert "CUDA graphs:" not in report([graphs])
    failed = EndToEnd("placement without CUDA graphs", Cost.invalid("out of memory"), mix)
    assert "CUDA graphs:" not in report([graphs, failed])


def test_the_report_says_how_much_of_the_measured_latency_the_partitions_costs_explain():
    parts = [SimpleNamespace(backend="dnnl", nodes=(0, 1), cost=Cost.measured(60e-6, 1e-6, 5)),
             SimpleNamespace(backend="tvm", nodes=(2,), cost=Cost.measured(35e-6, 1e-6, 5))]
    placement = SimpleNamespace(partitions=parts, model_name="m", operators=[0] * 3, device="llvm:znver3",
                                search="op-level", ran_on="", precision="fp32")
    entries = [EndToEnd("placement", Cost.measured(98e-6, 1e-6, 5), {"dnnl": 2, "tvm": 1})]
    text = render_report(SimpleNamespace(placement=placement, end_to_end=entries, measurement=None, two_level=None,
                                         verification=None, phases_s={}))
    assert "the partitions' costs add up to 0.095 ms; the placement measured 0.098 ms end to end (97% of it)" in text
    assert _row(text, "dnnl")[2:4] == ["0.060", "ms"] and _row(text, "tvm")[4] == "36.8%"
