"""The result table: each end-to-end row against the fastest other build timed the same way."""

from __future__ import annotations

import re
from types import SimpleNamespace

from collage_core.measure.threads import ThreadSettings
from collage_core.outputs.end_to_end import EndToEnd
from collage_core.outputs.report import IN_TURNS_HEADING, ONE_AFTER_ANOTHER_HEADING, is_noisy, render_report
from collage_core.records import Cost


def _row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(name + "  "))
    return line[len(name) :].split()


def _sections(text: str) -> tuple[str, str]:
    """The report's end-to-end rows timed in turns, and those measured one after another."""
    in_turns = text.split(IN_TURNS_HEADING, 1)[1]
    in_turns, one_after_another = in_turns.split(ONE_AFTER_ANOTHER_HEADING, 1)
    return in_turns, one_after_another


def _no_products() -> SimpleNamespace:
    """A model named "m" with nothing whose FLOPs the report counts (an addition): no throughput line."""
    from tvm import relax

    from collage_core.testing import function_module

    return SimpleNamespace(name="m", mod=function_module(lambda bb, a: relax.op.add(a, a), (4,)))


NO_PRODUCTS = _no_products()


def _placement(**fields) -> SimpleNamespace:
    return SimpleNamespace(
        **{
            "partitions": [],
            "model_name": "m",
            "operators": [0] * 415,
            "device": "cuda:sm_90a",
            "search": "op-level",
            "ran_on": "",
            "precision": "fp32",
            "layout": "model",
            "why_chosen": "",
            **fields,
        }
    )


def _report(entries, chosen_by="warm", **placement_fields) -> str:
    return render_report(
        SimpleNamespace(
            placement=_placement(**placement_fields),
            end_to_end=entries,
            measurement=None,
            two_level=None,
            verification=None,
            phases_s={},
            model=NO_PRODUCTS,
            threads=ThreadSettings.machine_defaults(),
            chosen_by=chosen_by,
        )
    )


def test_a_library_is_compared_with_other_builds_timed_the_same_way_never_with_itself():
    mix, alone = {"cublas": 240, "tvm": 175}, {"tvm": 415}
    entries = [
        EndToEnd("placement", Cost.measured(2.0e-3, 1e-4, 99), mix, timed_in_turns=True),
        EndToEnd("tvm alone, timed in turns", Cost.measured(4.0e-3, 1e-4, 99), alone, timed_in_turns=True),
        EndToEnd("placement, one after another", Cost.measured(1.8e-3, 1e-6, 5), mix),
        EndToEnd("tvm alone", Cost.measured(5.4e-3, 1e-6, 5), alone),
        EndToEnd("cublas + tvm for the rest", Cost.measured(1.7e-3, 1e-6, 5), mix),  # the same library as the placement
    ]
    in_turns, one_after_another = _sections(_report(entries))
    assert "vs best other build" in in_turns and "vs best other build" in one_after_another
    assert _row(in_turns, "placement")[3] == "0.500"  # in turns against in turns: 2.0 / 4.0
    assert _row(in_turns, "tvm alone")[3] == "2.000"
    assert _row(one_after_another, "placement")[3] == "0.333"  # 1.8 against tvm alone's 5.4, not against its own 1.7
    assert _row(one_after_another, "tvm alone")[3] == "3.176"  # 5.4 against the mix's fastest, 1.7
    assert "tvm alone, timed in turns" not in in_turns  # the heading says how the rows were timed


def test_two_builds_of_the_same_backend_mix_are_compared_and_one_build_measured_twice_is_not():
    """ONNX Runtime's own session and Collage's onnxruntime region over the same operators are two builds of one mix:
    told apart by the build each row measured. The returned placement's row and its own row are one build."""
    ort = {"onnxruntime": 45}
    entries = [
        EndToEnd("placement", Cost.measured(0.308e-3, 1e-6, 99), ort, timed_in_turns=True, build="own-session"),
        EndToEnd("onnxruntime alone, timed in turns", Cost.measured(0.310e-3, 1e-6, 99), ort, timed_in_turns=True, build="region"),
        EndToEnd("searched placement, timed in turns", Cost.measured(0.383e-3, 1e-6, 99), {"tvm": 45}, timed_in_turns=True, build="s"),
        EndToEnd("placement, one after another", Cost.measured(1.090e-3, 1e-6, 5), ort, build="own-session"),
        EndToEnd("onnxruntime's own session", Cost.measured(0.754e-3, 1e-6, 5), ort, build="own-session"),
        EndToEnd("onnxruntime alone", Cost.measured(1.000e-3, 1e-6, 5), ort, build="region"),
    ]
    in_turns, one_after_another = _sections(_report(entries))
    assert _row(in_turns, "placement")[3] == "0.994"  # 0.308 against the region's 0.310, not 0.383
    assert _row(in_turns, "onnxruntime alone")[3] == "1.006"
    assert _row(one_after_another, "placement")[3] == "1.090"  # 1.090 against the region's 1.000, not its own 0.754
    # Measured twice, one build: the second row says whose build it is, the first says nothing.
    assert _row(one_after_another, "onnxruntime's own session (the placement's build)")[3] == "0.754"
    assert _row(one_after_another, "onnxruntime alone")[3] == "1.326"  # against the own session, the other build
    assert "build)" not in one_after_another.split("onnxruntime's own session")[0]


def test_the_headline_is_the_latency_in_turns_when_a_contest_ran():
    """The returned placement's latency is the one it was chosen by: in turns with its rivals, not the
    one its build measured alone; without a contest, the one measured one after another."""
    mix, alone = {"dnnl": 30, "tvm": 15}, {"onnxruntime": 45}
    contest = [
        EndToEnd("placement", Cost.measured(0.214e-3, 1e-6, 99), alone, timed_in_turns=True),
        EndToEnd("searched placement, timed in turns", Cost.measured(0.631e-3, 1e-6, 99), mix, timed_in_turns=True),
        EndToEnd("placement, one after another", Cost.measured(0.964e-3, 1e-6, 5), alone),
        EndToEnd("searched placement, one after another", Cost.measured(0.443e-3, 1e-6, 5), mix),
    ]
    text = _report(contest, why_chosen="onnxruntime alone won the contest in turns")
    lines = text.splitlines()
    assert lines[1] == "latency: 0.214 ms ±0.001, timed in turns with 1 rival build"
    assert lines[2] == "why this placement: onnxruntime alone won the contest in turns"
    in_turns, one_after_another = _sections(text)
    assert _row(in_turns, "placement")[:2] == ["0.214", "ms"] and _row(in_turns, "searched placement")[3] == "2.949"
    assert _row(one_after_another, "placement")[:2] == ["0.964", "ms"]
    alone_only = _report([EndToEnd("placement", Cost.measured(0.5e-3, 1e-6, 5), mix)])
    assert alone_only.splitlines()[1] == "latency: 0.500 ms ±0.001, measured one after another"
    assert IN_TURNS_HEADING not in alone_only and "why this placement" not in alone_only


def test_rows_timed_in_turns_give_their_latency_after_a_pause_beside_the_warm_one_they_were_chosen_by():
    mix, alone = {"dnnl": 30, "tvm": 15}, {"openvino": 45}
    contest = [
        EndToEnd("placement", Cost.measured(0.214e-3, 1e-6, 99), alone, True, Cost.measured(0.412e-3, 2e-6, 9), 1.26),
        EndToEnd(
            "searched placement, timed in turns", Cost.measured(0.631e-3, 1e-6, 99), mix, True, Cost.measured(0.640e-3, 1e-6, 9), 1.31
        ),
        EndToEnd("placement, one after another", Cost.measured(0.964e-3, 1e-6, 5), alone),
    ]
    text = _report(contest)
    assert text.splitlines()[1] == (
        "latency: 0.214 ms ±0.001 warm, back to back, timed in turns with 1 rival build; 0.412 ms ±0.002 after 1.3 s idle"
    )
    in_turns, one_after_another = _sections(text)
    assert _row(in_turns, "placement")[:9] == ["0.214", "ms", "±0.001", "0.412", "ms", "±0.002", "after", "1.3", "s"]
    assert _row(in_turns, "searched placement")[10] == "2.949"  # against the warm latencies only
    assert "after a pause" in in_turns and "after a pause" not in one_after_another
    assert EndToEnd.from_json(contest[0].to_json()) == contest[0]
    assert "(the choice was made on the warm latencies, back to back; " in text
    chosen_after_a_pause = _report(contest, chosen_by="after-pause")
    assert "(the choice was made on the latencies after a pause; " in chosen_after_a_pause and "warm latencies" not in chosen_after_a_pause


def test_no_spread_over_half_the_median_is_printed_as_a_bare_plus_minus():
    rows = [
        EndToEnd("placement", Cost.measured(0.631e-3, 3.050e-3, 5), {"tvm": 1}),
        EndToEnd("tvm alone", Cost.measured(8.815e-3, 23.123e-3, 5), {"dnnl": 1}),
        EndToEnd("dnnl alone", Cost.measured(10e-3, 5.1e-3, 5), {"onnxruntime": 1}),
        EndToEnd("onnxruntime alone", Cost.measured(10e-3, 4.9e-3, 5), {"openvino": 1}),
    ]
    text = _report(rows)
    for median, spread in re.findall(r"([\d.]+) ms ±([\d.]+)", text):
        assert float(spread) <= float(median) / 2, (median, spread)
    assert "0.631 ms noisy (quartiles 3.050 ms apart), measured one after another" in text.splitlines()[1]
    assert _row(text, "tvm alone")[:6] == ["8.815", "ms", "noisy", "(quartiles", "23.123", "ms"]
    assert _row(text, "dnnl alone")[2] == "noisy"
    assert _row(text, "onnxruntime alone")[2] == "±4.900"
    assert [is_noisy(row.cost) for row in rows] == [True, True, True, False]


def test_the_report_gives_what_cuda_graphs_gained_when_the_placement_was_measured_both_ways():
    mix = {"cublas": 240, "tvm": 175}

    def report(entries):
        return _report(entries)

    graphs = EndToEnd("placement", Cost.measured(1.5e-3, 1e-6, 5), mix)
    launched = EndToEnd("placement without CUDA graphs", Cost.measured(2.4e-3, 1e-6, 5), mix)
    text = report([graphs, launched])
    assert "CUDA graphs: 1.500 ms replayed as graphs, 2.400 ms launching kernel by kernel (1.60x)" in text
    assert _row(text, "placement without CUDA graphs")[3] == "-"  # the same mix: not another build to compare with
    assert "CUDA graphs:" not in report([graphs])
    failed = EndToEnd("placement without CUDA graphs", Cost.invalid("out of memory"), mix)
    assert "CUDA graphs:" not in report([graphs, failed])


def test_the_report_says_how_much_of_the_measured_latency_the_partitions_costs_explain():
    parts = [
        SimpleNamespace(backend="dnnl", nodes=(0, 1), cost=Cost.measured(60e-6, 1e-6, 5)),
        SimpleNamespace(backend="tvm", nodes=(2,), cost=Cost.measured(35e-6, 1e-6, 5)),
    ]
    entries = [
        EndToEnd("placement", Cost.measured(90e-6, 1e-6, 99), {"dnnl": 2, "tvm": 1}, timed_in_turns=True),
        EndToEnd("placement, one after another", Cost.measured(98e-6, 1e-6, 5), {"dnnl": 2, "tvm": 1}),
    ]
    text = _report(entries, partitions=parts, operators=[0] * 3, device="llvm:znver3")
    # The partitions were measured one after another: so is the end-to-end latency they are held against.
    assert (
        "the partitions' costs add up to 0.095 ms; the placement measured 0.098 ms end to end one after another, as they were (97% of it)"
    ) in text
    assert _row(text, "dnnl")[2:4] == ["0.060", "ms"] and _row(text, "tvm")[4] == "36.8%"


def test_the_report_gives_the_fraction_of_the_devices_peak_the_placement_reaches():
    """FLOPs counted from the model over the headline's latency, against the peak of the GPU Collage recorded."""
    from tvm import relax

    from collage_core.testing import function_module

    model = SimpleNamespace(name="m", mod=function_module(lambda bb, a, b: relax.op.matmul(a, b), (1024, 2048), (2048, 4096)))
    mix = {"cublas": 1}
    entries = [
        EndToEnd("placement", Cost.measured(1.0e-3, 1e-6, 99), mix, timed_in_turns=True),
        EndToEnd("tvm alone, timed in turns", Cost.measured(4.0e-3, 1e-6, 99), {"tvm": 1}, timed_in_turns=True),
    ]
    h200 = "cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0, driver 580.159.04)"

    def report(**placement_fields):
        return render_report(
            SimpleNamespace(
                placement=_placement(**placement_fields),
                end_to_end=entries,
                measurement=None,
                two_level=None,
                verification=None,
                phases_s={},
                model=model,
                accuracy=None,
                threads=ThreadSettings.machine_defaults(),
                chosen_by="warm",
            )
        )

    # 2 x 1024 x 2048 x 4096 = 17.2 GFLOP in 1 ms: 17.18 TFLOP/s, 25.6% of 67, 1.7% of bf16's dense 989.5.
    line = report(device=h200).splitlines()[2]
    assert (
        line.startswith("17.2 GFLOP per run (")
        and "): 17.18 TFLOP/s, 25.6% of the H200's 67 TFLOP/s fp32 (CUDA cores) peak (NVIDIA H200" in line
    )
    assert "1.7% of the H200's 989.5 TFLOP/s bf16 dense tensor-core peak" in report(device=h200, precision="bf16", sixteen_bit_operators=())
    # Replayed on another GPU: the latency is that GPU's, and so is the peak.
    replayed = report(device=h200, ran_on="cuda:sm_90a (NVIDIA H100 80GB HBM3, compute capability 9.0, CUDA 13.0)")
    assert "25.6% of the H100 SXM's 67 TFLOP/s" in replayed
    assert report(device="llvm:znver3").splitlines()[2].endswith(": 17.18 TFLOP/s, peak of llvm:znver3 unknown")
    assert "GFLOP per run" not in _report(entries)  # no model to count


def test_thread_settings_other_than_the_machine_defaults_are_named():
    entries = [EndToEnd("placement", Cost.measured(2.0e-3, 1e-4, 99), {"tvm": 1}, timed_in_turns=True)]

    def report(threads):
        return render_report(
            SimpleNamespace(
                placement=_placement(),
                end_to_end=entries,
                measurement=None,
                two_level=None,
                verification=None,
                phases_s={},
                model=NO_PRODUCTS,
                threads=threads,
                chosen_by="warm",
            )
        )

    assert "threads:" not in report(ThreadSettings.machine_defaults())
    fewer = ThreadSettings(tvm=ThreadSettings.machine_defaults().tvm + 1, backends=1)
    assert (
        f"threads: {fewer.tvm} in TVM's pool, 1 in each backend's pool, idle threads waiting by "
        f"GOMP_SPINCOUNT=30000 (not this machine's defaults)"
    ) in report(fewer)
