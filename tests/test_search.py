"""The op-level search against a brute force over every exact cover, on small branching graphs."""

from __future__ import annotations

import hashlib
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_core.errors import CollageError
from collage_core.records import Candidate, Cost
from collage_core.search.graph import OpGraph
from collage_core.search.op_level import PROGRESS_EVERY, NoPlacementError, search_op_level


def deterministic_costs(candidates, seed: int) -> dict[str, Cost]:
    """A deterministic cost model for testing the search: whole seconds from a seeded hash of each key.

    Whole numbers keep sums exact, so the search and the brute force agree to the last bit, and
    the small range makes ties common.
    """
    return {c.key: Cost.measured(1 + int(hashlib.sha256(f"{seed}:{c.key}".encode()).hexdigest(), 16) % 8, 0.0, 1) for c in candidates}


def candidate(backend: str, *nodes: int) -> Candidate:
    return Candidate(backend, f"{backend}.group", frozenset(nodes), f"{backend}:{sorted(nodes)}")


def singletons(graph: OpGraph, backend: str = "ref") -> list[Candidate]:
    return [candidate(backend, node) for node in range(len(graph))]


def exact_covers(size: int, candidates, covered: frozenset = frozenset()):
    """Every set of candidates covering 0..size-1 exactly once, each set generated once."""
    if len(covered) == size:
        yield ()
        return
    lowest = min(set(range(size)) - covered)
    for option in candidates:
        if lowest in option.nodes and not option.nodes & covered:
            for rest in exact_covers(size, candidates, covered | option.nodes):
                yield (option,) + rest


def can_run_in_some_order(graph: OpGraph, parts) -> bool:
    """True if the parts can be placed one at a time, each after every part it reads from."""
    placed: set[int] = set()
    waiting = list(parts)
    while waiting:
        runnable = [p for p in waiting if all(q in placed or q in p.nodes for n in p.nodes for q in graph.preds[n])]
        if not runnable:
            return False
        placed |= runnable[0].nodes
        waiting.remove(runnable[0])
    return True


def brute_force_minimum(graph: OpGraph, candidates, costs) -> float | None:
    usable = [c for c in set(candidates) if c.key in costs and math.isfinite(costs[c.key].seconds)]
    totals = [sum(costs[c.key].seconds for c in cover) for cover in exact_covers(len(graph), usable) if can_run_in_some_order(graph, cover)]
    return min(totals, default=None)


def assert_executable_exact_cover(graph: OpGraph, placement) -> None:
    covered: set[int] = set()
    for part in placement:
        assert not part.nodes & covered, f"{part} covers an operator twice"
        outside_preds = {q for n in part.nodes for q in graph.preds[n]} - part.nodes
        assert outside_preds <= covered, f"{part} runs before an operator it reads"
        covered |= part.nodes
    assert covered == set(range(len(graph)))


def assert_optimal(graph: OpGraph, candidates, costs) -> tuple[Candidate, ...]:
    placement = search_op_level(graph, candidates, costs)
    assert_executable_exact_cover(graph, placement)
    assert sum(costs[c.key].seconds for c in placement) == brute_force_minimum(graph, candidates, costs)
    return placement


# conv -> relu -> conv -> add(conv, relu's input) -> relu: a residual block.
DIAMOND = OpGraph(ops=["nn.conv2d", "nn.relu", "nn.conv2d", "add", "nn.relu"], preds=[set(), {0}, {1}, {0, 2}, {3}])
DIAMOND_CANDIDATES = singletons(DIAMOND) + [
    candidate("cudnn", 0, 1),
    candidate("cudnn", 1, 2),
    candidate("trt", 0, 1, 2),
    candidate("trt", 2, 3),
    candidate("trt", 2, 3, 4),
    candidate("cutlass", 3, 4),
    candidate("cutlass", 0, 1, 2, 3, 4),
]

# One input, three branches of two operators, a concatenation, then two separate outputs.
THREE_BRANCHES = OpGraph(
    ops=["nn.relu", "nn.conv2d", "nn.relu", "nn.conv2d", "nn.relu", "nn.max_pool2d", "nn.relu", "concat", "sum", "mean"],
    preds=[set(), {0}, {1}, {0}, {3}, {0}, {5}, {2, 4, 6}, {7}, {7}],
)
THREE_BRANCHES_CANDIDATES = singletons(THREE_BRANCHES) + [
    candidate("cudnn", 1, 2),
    candidate("cudnn", 3, 4),
    candidate("cudnn", 5, 6),
    candidate("trt", 0, 1, 2),
    candidate("trt", 1, 3),
    candidate("trt", 2, 4, 6, 7),
    candidate("trt", 6, 7),
    candidate("cutlass", 1, 2, 3, 4, 5, 6, 7),
    candidate("cutlass", 7, 8, 9),
    candidate("cutlass", 7, 8),
]

# Two inputs feeding several outputs, some of which are read again.
SEVERAL_OUTPUTS = OpGraph(
    ops=["matmul", "matmul", "add", "nn.gelu", "multiply", "nn.softmax", "matmul"], preds=[set(), set(), {0, 1}, {2}, {1}, {0}, {3, 4}]
)
SEVERAL_OUTPUTS_CANDIDATES = singletons(SEVERAL_OUTPUTS) + [
    candidate("cublas", 0, 1),
    candidate("cublas", 0, 2),
    candidate("cublas", 2, 3),
    candidate("trt", 0, 5),
    candidate("trt", 1, 4, 6),
    candidate("trt", 3, 4, 6),
    candidate("cutlass", 0, 1, 2, 3),
]

SMALL_GRAPHS = {
    "diamond": (DIAMOND, DIAMOND_CANDIDATES),
    "three branches": (THREE_BRANCHES, THREE_BRANCHES_CANDIDATES),
    "several outputs": (SEVERAL_OUTPUTS, SEVERAL_OUTPUTS_CANDIDATES),
}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("name", SMALL_GRAPHS)
def test_small_graphs_match_brute_force(name, seed):
    graph, candidates = SMALL_GRAPHS[name]
    assert_optimal(graph, candidates, deterministic_costs(candidates, seed))


def test_cheap_whole_group_is_chosen():
    costs = deterministic_costs(DIAMOND_CANDIDATES, seed=0)
    whole = candidate("cutlass", 0, 1, 2, 3, 4)
    costs[whole.key] = Cost.measured(0.5, 0.0, 1)
    assert search_op_level(DIAMOND, DIAMOND_CANDIDATES, costs) == (whole,)


# a1 -> b1 and b2 -> a2: A = {a1, a2} and B = {b1, b2} are each convex, but each waits on the other.
A1, B2, B1, A2 = 0, 1, 2, 3
CROSSED = OpGraph(ops=["a1", "b2", "b1", "a2"], preds=[set(), set(), {A1}, {B2}])
GROUP_A = candidate("fast", A1, A2)
GROUP_B = candidate("fast", B1, B2)


def test_two_convex_groups_that_wait_on_each_other_are_never_chosen_together():
    assert CROSSED.is_convex(GROUP_A.nodes) and CROSSED.is_convex(GROUP_B.nodes)
    candidates = singletons(CROSSED) + [GROUP_A, GROUP_B]
    costs = {c.key: Cost.measured(10.0, 0.0, 1) for c in candidates}
    costs[GROUP_A.key] = costs[GROUP_B.key] = Cost.measured(1.0, 0.0, 1)
    placement = assert_optimal(CROSSED, candidates, costs)
    assert not {GROUP_A, GROUP_B} <= set(placement)


def test_groups_that_cannot_be_ordered_raise():
    costs = {GROUP_A.key: Cost.measured(1.0, 0.0, 1), GROUP_B.key: Cost.measured(1.0, 0.0, 1)}
    with pytest.raises(NoPlacementError, match="executable order"):
        search_op_level(CROSSED, [GROUP_A, GROUP_B], costs)


@pytest.mark.parametrize(
    "graph, parts",
    [
        # The part holding the lowest operator, {0, 2}, must wait for the part {1}.
        (OpGraph(ops=["x0", "y1", "x2"], preds=[set(), set(), {1}]), [candidate("t", 0, 2), candidate("t", 1)]),
        # ... and {0, 2} waits on {1, 4}, which waits on {3}: a part unrelated to {0, 2} goes first.
        (
            OpGraph(ops=["x0", "z1", "x2", "y3", "z4"], preds=[set(), set(), {1}, set(), {3}]),
            [candidate("t", 0, 2), candidate("t", 1, 4), candidate("t", 3)],
        ),
    ],
)
def test_part_with_the_lowest_operator_may_have_to_wait(graph, parts):
    candidates = singletons(graph) + parts
    costs = {c.key: Cost.measured(10.0, 0.0, 1) for c in candidates}
    costs.update({part.key: Cost.measured(1.0, 0.0, 1) for part in parts})
    assert set(assert_optimal(graph, candidates, costs)) == set(parts)


@pytest.mark.parametrize("name", SMALL_GRAPHS)
def test_shuffled_candidates_give_the_same_placement(name):
    graph, candidates = SMALL_GRAPHS[name]
    # Equal costs everywhere, so the choice among many optimal placements rests on tie-breaking.
    costs = {c.key: Cost.measured(1.0, 0.0, 1) for c in candidates}
    expected = search_op_level(graph, candidates, costs)
    for seed in range(10):
        shuffled = random.Random(seed).sample(candidates, len(candidates))
        assert search_op_level(graph, shuffled, costs) == expected


@pytest.mark.parametrize("not_measured", [Cost.invalid("build failed"), Cost.unknown(), None])
def test_candidates_without_a_measured_cost_are_never_chosen(not_measured):
    costs = deterministic_costs(DIAMOND_CANDIDATES, seed=0)
    whole = candidate("cutlass", 0, 1, 2, 3, 4)
    if not_measured is None:
        del costs[whole.key]
    else:
        costs[whole.key] = not_measured
    placement = assert_optimal(DIAMOND, DIAMOND_CANDIDATES, costs)
    assert whole not in placement


def test_operator_without_a_valid_candidate_is_named():
    costs = deterministic_costs(DIAMOND_CANDIDATES, seed=0)
    covering = sorted((group for group in DIAMOND_CANDIDATES if 3 in group.nodes), key=lambda c: (c.sort_key, c.key))
    for group in covering:
        costs[group.key] = Cost.invalid(f"BuildError: TVM build failed:\n  in {group.key}\nCheck failed: a float")
    with pytest.raises(NoPlacementError, match=r"operator 3 \(add\)") as raised:
        search_op_level(DIAMOND, DIAMOND_CANDIDATES, costs)
    assert isinstance(raised.value, CollageError)
    assert "\n" not in str(raised.value)
    # Why: the first covering candidate's reason, its last line.
    assert str(raised.value).endswith(
        f"none of the {len(covering)} candidates covering it can be placed (invalid, unmeasured or not convex); "
        f"{covering[0].key}: Check failed: a float"
    )


def test_empty_graph_needs_no_candidates():
    assert search_op_level(OpGraph(ops=[], preds=[]), [], {}) == ()


def test_progress_is_reported_while_searching_and_at_the_end():
    # A chain with only singletons expands exactly one state per operator.
    length = 2 * PROGRESS_EVERY + PROGRESS_EVERY // 2
    chain = OpGraph(ops=["relu"] * length, preds=[set()] + [{n - 1} for n in range(1, length)])
    candidates = singletons(chain)
    reported = []
    search_op_level(chain, candidates, deterministic_costs(candidates, seed=0), on_progress=reported.append)
    assert reported == [PROGRESS_EVERY, 2 * PROGRESS_EVERY, length]


@st.composite
def small_problems(draw):
    size = draw(st.integers(1, 9))
    preds = [draw(st.sets(st.integers(0, node - 1), max_size=3)) if node else set() for node in range(size)]
    graph = OpGraph(ops=[f"op{n}" for n in range(size)], preds=preds)
    # Groups are drawn without regard to convexity: the search must reject those that cannot run.
    groups = draw(st.lists(st.sets(st.integers(0, size - 1), min_size=1, max_size=4), max_size=12))
    candidates = singletons(graph) + [candidate("other", *group) for group in groups]
    costs = {
        c.key: draw(st.one_of(st.integers(0, 20).map(lambda s: Cost.measured(s, 0.0, 1)), st.just(Cost.invalid("x")))) for c in candidates
    }
    return graph, candidates, costs


@settings(max_examples=400, deadline=None)
@given(small_problems())
def test_search_finds_the_brute_force_minimum(problem):
    graph, candidates, costs = problem
    minimum = brute_force_minimum(graph, candidates, costs)
    if minimum is None:
        with pytest.raises(NoPlacementError):
            search_op_level(graph, candidates, costs)
    else:
        assert_optimal(graph, candidates, costs)


def test_brute_force_sees_every_exact_cover():
    # The reference itself: on a 3-operator chain with every subset as a candidate, the exact
    # covers are the set partitions of {0, 1, 2}: Bell(3) = 5.
    chain = OpGraph(ops=["a", "b", "c"], preds=[set(), {0}, {1}])
    every_group = [candidate("any", *group) for size in (1, 2, 3) for group in itertools.combinations(range(3), size)]
    assert len(list(exact_covers(3, every_group))) == 5
    assert sum(can_run_in_some_order(chain, cover) for cover in exact_covers(3, every_group)) == 4
