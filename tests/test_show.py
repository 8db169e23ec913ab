"""collage show: a placement drawn by Graphviz and explained partition by partition."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import attrs
import pytest

import collage_core
from collage_core.cli import EXIT_ERROR, main
from collage_core.outputs.explain import explain
from collage_core.outputs.picture import HIGHLIGHT, placement_dot
from collage_core.outputs.placement_file import Placement, PlacementFileError, load_placement
from collage_core.outputs.show import write_picture
from collage_core.records import Cost, Partition

TINY_RESNET = Path(__file__).resolve().parents[1] / "models" / "tiny_resnet.onnx"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed: apt-get install graphviz")


def ms(value: float) -> Cost:
    return Cost.measured(value * 1e-3, 0.0, 10)


def part(backend: str, pattern: str, nodes, cost: Cost) -> Partition:
    return Partition(backend, pattern, nodes, f"{pattern}-{'-'.join(map(str, nodes))}", cost)


def hand_built(partitions, considered, operators, inputs_of) -> Placement:
    return Placement(
        model_name="hand_built",
        model_fingerprint="0",
        operators=operators,
        target={"kind": "llvm"},
        device="cpu",
        backends={"dnnl": {}, "tvm": {}},
        search="op-level",
        partitions=partitions,
        inputs_of=inputs_of,
        considered=considered,
    )


# A convolution with bias and ReLU, then a convolution whose result is added to the first one's.
OPERATORS = ("relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.nn.conv2d", "relax.add", "relax.nn.relu")
INPUTS_OF = ((), (0,), (1,), (2,), (2, 3), (4,))
CONV_BIAS_RELU = part("dnnl", "dnnl.conv2d_bias_relu", (0, 1, 2), ms(0.5))
CONV = part("dnnl", "dnnl.conv2d", (3,), ms(0.3))
ADD_RELU = part("tvm", "tvm.add_relu", (4, 5), ms(0.05))
RIVALS = (
    part("tvm", "tvm.conv2d_bias_relu", (0, 1, 2), ms(2.0)),
    part("tvm", "tvm.op", (0,), ms(0.45)),
    part("tvm", "tvm.op", (1,), ms(0.1)),
    part("tvm", "tvm.op", (2,), ms(0.1)),
    part("tvm", "tvm.relu_conv2d", (2, 3), ms(0.29)),
    part("tvm", "tvm.op", (3,), ms(0.35)),
    part("dnnl", "dnnl.conv2d_add_relu", (3, 4, 5), Cost.invalid("no sum post-op for this layout\nbuild log follows")),
    part("tvm", "tvm.op", (4,), ms(0.01)),
    part("tvm", "tvm.op", (5,), ms(0.01)),
    part("onnxruntime", "onnxruntime.region", range(6), Cost.unknown()),
)


@pytest.fixture
def small() -> Placement:
    chosen = (CONV_BIAS_RELU, CONV, ADD_RELU)
    return hand_built(chosen, chosen + RIVALS, OPERATORS, INPUTS_OF)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory, shared_cost_db) -> Path:
    """A real placement of the shipped ResNet on TVM, saved as ``collage optimize`` saves it."""
    workspace = tmp_path_factory.mktemp("show")
    collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm"],
        cost_db=shared_cost_db,
        output_dir=workspace / "out",
        compare_backends=False,
        calibration_rounds=0,
        verify=False,
        show_progress=False,
    )
    return workspace / "out" / "placement.json"


def blocks_of(explanation: str) -> list[str]:
    """The summary, then one block per partition."""
    return explanation.split("\n\n#")


def block_of(explanation: str, number: int) -> str:
    return "#" + blocks_of(explanation)[number]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which always comes first."""
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_dot_has_one_node_per_operator_a_cluster_per_group_and_the_data_edges(optimized):
    placement = load_placement(optimized)
    dot = placement_dot(placement)
    nodes = [int(n) for n in re.findall(r"^\s*op(\d+) \[label=", dot, re.MULTILINE)]
    assert sorted(nodes) == list(range(len(placement.operators))) == list(range(45))
    groups = [p for p in placement.partitions if len(p.nodes) > 1]
    assert groups and len(re.findall(r"subgraph cluster_\d+ \{", dot)) == len(groups)
    edges = re.findall(r"^\s*op(\d+) -> op(\d+);", dot, re.MULTILINE)
    assert sorted((int(b), int(a)) for a, b in edges) == sorted((n, p) for n, ps in enumerate(placement.inputs_of) for p in ps)
    assert "rankdir=TB" in dot and "newrank=true" in dot and "legend" in dot


def test_costliest_partitions_are_outlined_in_red(small):
    dot = placement_dot(small)
    assert re.search(rf'label="top 1: dnnl dnnl.conv2d_bias_relu\\n0.500 ms \(58.8%\)".*color="{HIGHLIGHT}".*penwidth=3', dot)
    assert re.search(rf'op3 \[label="3 conv2d\\ntop 2: 0.300 ms".*color="{HIGHLIGHT}".*penwidth=3', dot)
    assert 'label="top 3: tvm tvm.add_relu' in dot


def test_top_five_and_any_partition_over_five_percent_are_highlighted():
    costs = [10, 9, 8, 7, 6, 5, 4, 1]  # 5 and 4 of 50 are over 5%, 1 is not
    chain = tuple(part("tvm", "tvm.op", (n,), ms(c)) for n, c in enumerate(costs))
    dot = placement_dot(hand_built(chain, chain, ["relax.nn.relu"] * len(costs), [()] + [(n,) for n in range(len(costs) - 1)]))
    assert [int(rank) for rank in re.findall(r"top (\d+): ", dot)] == list(range(1, 8))
    assert 'op7 [label="7 relu", fillcolor' in dot
    assert "the 7 costliest partitions" in dot


def test_explanation_lists_the_chosen_candidate_and_its_competitors_with_costs(small):
    explanation = explain(small)
    first = block_of(explanation, 1)
    assert first.splitlines()[0] == "#1 dnnl dnnl.conv2d_bias_relu: 0.500 ms (top 1)"
    assert "operators: 0 conv2d, 1 add, 2 relu" in first
    chosen_rows = [line for line in first.splitlines() if line.split()[:1] == ["chosen"]]
    assert len(chosen_rows) == 1 and "dnnl.conv2d_bias_relu" in chosen_rows[0]
    for pattern, cost in [("dnnl.conv2d_bias_relu", "0.500 ms"), ("tvm.conv2d_bias_relu", "2.000 ms"), ("tvm.relu_conv2d", "0.290 ms")]:
        assert re.search(rf"{re.escape(pattern)}\s+[\d, -]+\s+{cost}", first), pattern
    assert "invalid" not in first  # the invalid candidate does not touch operators 0-2
    assert re.search(r"onnxruntime\.region\s+0-5\s+measured end to end only", first)
    assert "why: cheapest cover of these operators: 0.500 ms vs tvm.op + tvm.op + tvm.op 0.650 ms" in first
    assert (
        "cheaper candidates reach into other partitions; the search minimises the whole placement: tvm.relu_conv2d 0.290 ms (2-3)" in first
    )

    second = block_of(explanation, 2)
    assert re.search(r"dnnl\.conv2d_add_relu\s+3-5\s+invalid: no sum post-op for this layout$", second, re.MULTILINE)
    assert "why: cheapest cover of these operators: 0.300 ms vs tvm.op 0.350 ms" in second

    third = block_of(explanation, 3)
    assert "why: not the cheapest cover of these operators in isolation: tvm.op + tvm.op 0.020 ms vs 0.050 ms;" in third


def test_explanation_summary_counts_partitions_and_cost_per_backend(small):
    summary = blocks_of(explain(small))[0]
    assert summary.startswith("hand_built: 6 operators in 3 partitions, op-level search on cpu")
    assert re.search(r"^dnnl\s+2\s+4\s+0.800 ms\s+94.1%$", summary, re.MULTILINE)
    assert re.search(r"^tvm\s+1\s+2\s+0.050 ms\s+5.9%$", summary, re.MULTILINE)
    assert re.search(r"^1\s+#1\s+dnnl\s+dnnl.conv2d_bias_relu\s+0-2\s+0.500 ms\s+58.8%$", summary, re.MULTILINE)


def test_graph_level_region_is_drawn_and_explained_as_measured_end_to_end_only(small):
    region = part("onnxruntime", "onnxruntime.region", range(6), Cost.unknown())
    placement = attrs.evolve(small, partitions=(region,))
    assert 'label="onnxruntime onnxruntime.region\\nmeasured end to end only"' in placement_dot(placement)
    explanation = explain(placement)
    assert "#1 onnxruntime onnxruntime.region: measured end to end only" in explanation
    assert "why: a graph-level region, measured end to end only" in explanation


WON_CONTEST = (
    "onnxruntime alone won the contest in turns: 0.214 ms against the searched placement's 0.631 ms, "
    "2.95x; the searched placement (found by the two-level search) is saved as searched-placement.json"
)


@pytest.mark.parametrize(
    "why_chosen",
    [
        "found by the two-level search; it won the contest in turns: 0.631 ms against onnxruntime alone's 0.700 ms, 1.11x",
        "found by the op-level search; not compared with baselines",
        WON_CONTEST,
    ],
    ids=["two-level search", "op-level search", "a baseline won the contest"],
)
def test_show_says_why_the_placement_was_chosen_as_its_file_says(small, tmp_path, capsys, why_chosen):
    saved = attrs.evolve(small, why_chosen=why_chosen).save(tmp_path / "placement.json")
    assert load_placement(saved).why_chosen == why_chosen
    assert main(["show", str(saved)]) == 0
    summary = blocks_of(capsys.readouterr().out)[0].splitlines()
    assert summary[:2] == ["hand_built: 6 operators in 3 partitions, op-level search on cpu", f"why this placement: {why_chosen}"]
    title = re.search(r'graph \[.*label="([^"]*)"\];', placement_dot(load_placement(saved))).group(1)
    assert " ".join(title.split("\\n")[1:]) == f"why this placement: {why_chosen}"


def test_a_baselines_placement_is_headed_as_the_baseline_it_is_not_as_a_search(small):
    """baselines/onnxruntime_alone.json, as the run saves it, shown: "baseline onnxruntime alone", in words and picture."""
    baseline = attrs.evolve(small, search="baseline: onnxruntime alone")
    assert blocks_of(explain(baseline))[0].startswith("hand_built: 6 operators in 3 partitions, baseline onnxruntime alone on cpu")
    assert "6 operators, 3 partitions, baseline onnxruntime alone" in placement_dot(baseline)
    assert "search" not in blocks_of(explain(baseline))[0].splitlines()[0]


def test_a_region_of_a_baseline_that_won_the_contest_is_not_said_to_be_kept_by_the_two_level_search(small):
    region = part("onnxruntime", "onnxruntime.region", range(6), Cost.unknown())
    won = attrs.evolve(small, partitions=(region,), search="two-level", why_chosen=WON_CONTEST)
    explanation = explain(won)
    assert "two-level search kept it" not in explanation
    assert (
        "why: a graph-level region, measured end to end only: it came with the whole placement (see why this placement, above)"
    ) in explanation
    assert "the two-level search kept it" in explain(attrs.evolve(won, why_chosen=""))  # a file that does not say


def test_explanation_of_a_real_placement_covers_every_partition(optimized):
    placement = load_placement(optimized)
    assert placement.considered, "optimize should record the candidates it considered"
    explanation = explain(placement)
    blocks = blocks_of(explanation)[1:]
    assert len(blocks) == len(placement.partitions)
    for block in blocks:
        assert len(re.findall(r"^\s+chosen\s", block, re.MULTILINE)) == 1, block
        assert "why: " in block


def test_placement_written_without_the_graph_is_refused(small):
    with pytest.raises(PlacementFileError, match="placement: written without the operator graph .* re-run collage optimize"):
        placement_dot(attrs.evolve(small, inputs_of=()))


@needs_dot
def test_svg_and_png_are_drawn_by_dot(optimized, tmp_path):
    placement = load_placement(optimized)
    svg = write_picture(placement, tmp_path / "placement.svg").read_text()
    assert "<svg" in svg and "relu" in svg and svg.count('class="cluster"') >= 1
    width, height = png_size(write_picture(placement, tmp_path / "placement.png").read_bytes())
    assert width >= 200 and height >= 400, (width, height)


@needs_dot
def test_html_page_holds_the_svg_legend_and_explanation(small, tmp_path):
    page = write_picture(small, tmp_path / "placement.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<?xml" not in page
    assert page.count("<svg") == 1 and "</svg>" in page
    assert 'class="swatch" style="background:' in page and ">dnnl</li>" in page
    assert "why: cheapest cover of these operators: 0.500 ms" in page


def test_missing_dot_is_one_line_with_the_fix(small, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    small.save(tmp_path / "placement.json")
    assert main(["show", str(tmp_path / "placement.json"), "-o", str(tmp_path / "placement.svg")]) == EXIT_ERROR
    assert capsys.readouterr().err == (
        "collage: error: Graphviz's dot is not installed: apt-get install graphviz (or write a .dot file and render it elsewhere)\n"
    )
    assert main(["show", str(tmp_path / "placement.json"), "-o", str(tmp_path / "placement.dot")]) == 0
    assert (tmp_path / "placement.dot").read_text().startswith("digraph placement {")


def test_cli_prints_the_explanation_and_writes_pictures(small, tmp_path, capsys):
    saved = small.save(tmp_path / "placement.json")
    assert main(["show", str(saved)]) == 0
    assert capsys.readouterr().out == explain(small) + "\n"
    assert main(["show", str(saved), "-o", str(tmp_path / "placement.dot"), "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"saved: {tmp_path / 'placement.dot'}\n") and "why: " in out
    assert (tmp_path / "placement.dot").read_text() == placement_dot(small)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["{placement}", "-o", "{tmp}/placement.pdf"], r"placement.pdf: cannot tell the picture format from '.pdf'"),
        (["{tmp}/missing.json"], r"missing.json: no such placement file"),
        (["{bare}", "-o", "{tmp}/placement.svg"], r"bare.json: written without the operator graph"),
    ],
)
def test_cli_errors_are_one_line(small, tmp_path, capsys, arguments, message):
    placement = small.save(tmp_path / "placement.json")
    bare = attrs.evolve(small, inputs_of=()).save(tmp_path / "bare.json")
    argv = [a.format(placement=placement, bare=bare, tmp=tmp_path) for a in arguments]
    assert main(["show", *argv]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("collage: error: ") and re.search(message, err), err
