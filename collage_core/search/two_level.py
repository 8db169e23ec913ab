"""The second level: a genetic search (DEAP) over which op groups go to graph-level backends.

Graph-level backends (ONNX Runtime, TensorRT) optimise whole regions, so a region's cost is not
the sum of its operators' costs. After the op-level search, each op group gets a gene: 0 keeps
its op-level backend, ``i`` hands it to the ``i``-th graph-level backend that supports all its
operators (several graph-level backends in one run). A genome is scored by the measured
end-to-end latency of its build; each distinct placement is measured once. A genome whose latency,
predicted from what was measured so far (:mod:`collage_core.search.genome_prediction`), is more than
``predict_margin`` over the best measured is scored by the prediction and not built.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from typing import Callable, Optional, Sequence

import attrs
from deap import algorithms, base, creator, tools

from collage_core.api_checks import described, number, whole
from collage_core.records import Cost, Partition
from collage_core.search.genome_prediction import LatencyPredictor
from collage_core.search.graph import OpGraph
from collage_core.search.regions import KEEP, OpGroup, decode, genome_key


@attrs.frozen
class TwoLevelSettings:
    """Population and generations bound the search; ``budget_s`` stops it early, and so do
    ``patience`` generations in a row without a faster placement; ``seed`` fixes it.

    A placement counts as faster only when it beats the best before by more than either
    measurement's spread and by ``min_gain`` of it: end-to-end times on a busy machine move by a few
    percent between runs, and a "gain" inside that keeps the search building placements that teach
    nothing (BERT-base on 2 cores: 1.2% and 1.9% gains within a 2% spread kept it going four more
    generations, 400 s, for a placement the contest then measured slower).

    ``predict_margin``: a genome predicted slower than the best measured by more than this share is
    not built (None builds every genome; on BERT-base, 2 cores, each build took about 9 s)."""

    population: int = described(12, whole(2), "two-level population")  # crossover draws two placements from it
    generations: int = described(8, whole(0), "two-level generations")
    patience: int = described(3, whole(1), "two-level: stop after this many generations without a faster placement")
    budget_s: float = described(
        900.0,
        number(0),
        "two-level search budget: seconds of end-to-end measurement, those read from the cost database counted at what they took",
    )
    seed: int = described(0, whole(None), "two-level random seed (same seed and costs, same result)")
    min_gain: float = described(
        0.01,
        number(0),
        "two-level: a generation counts as faster only when its best beats "
        "the one before by more than the measurements' spread and by this fraction of it",
    )
    predict_margin: Optional[float] = described(
        0.1,
        number(0).or_none(),
        "two-level: a genome whose latency, "
        "predicted from the placements measured so far, is over the best by "
        "more than this fraction is not built",
        help_for_none="two-level: build and measure every genome, predicting none",
    )
    crossover_probability: float = 0.6
    mutation_probability: float = 0.4
    gene_mutation_probability: float = 0.1


@attrs.frozen
class GenerationRecord:
    """Where the search stood after a generation (0: the seeds and the first population): the
    fastest placement's latency and operators per backend, and how many operators each backend
    gained (or lost, when negative) against the generation before; nothing changed is left out."""

    generation: int
    best_s: float
    budget_left_s: float
    operators_by_backend: dict = attrs.field(converter=dict)
    gained: dict = attrs.field(converter=dict)

    def gains_text(self) -> str:
        """``openvino +12 ops, onnxruntime -12 ops``, or ``no change``."""
        if not self.gained:
            return "no change"
        return ", ".join(f"{backend} {count:+d} ops" for backend, count in sorted(self.gained.items(), key=lambda kv: -kv[1]))


def history_text(history: Sequence[GenerationRecord]) -> str:
    """``0: tvm 40, onnxruntime 7 (1.234 ms); 1: openvino +7 ops, onnxruntime -7 ops (1.100 ms); ...``"""
    pieces = []
    for record in history:
        what = ", ".join(f"{b} {n}" for b, n in record.operators_by_backend.items()) if record.generation == 0 else record.gains_text()
        best = f"{record.best_s * 1e3:.3f} ms" if math.isfinite(record.best_s) else "nothing measured"
        pieces.append(f"{record.generation}: {what} ({best})")
    return "; ".join(pieces)


def operators_by_backend(parts: Sequence[Partition]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in parts:
        counts[part.backend] = counts.get(part.backend, 0) + len(part.nodes)
    return dict(sorted(counts.items()))


@attrs.frozen
class TwoLevelResult:
    parts: tuple[Partition, ...]
    latency: Cost
    genome: tuple[int, ...]
    measured: int
    evaluated: int
    generations: int
    seconds: float
    # Of the ``measured`` placements, how many the evaluator read from a cost database (it says).
    from_database: int = 0
    # One record per generation, from 0; which backends gained ground as the search went.
    history: tuple[GenerationRecord, ...] = ()
    # Distinct placements scored by their predicted latency instead of a build (predicted too slow).
    predicted: int = 0


# The fitness of a placement that could not be measured: worse than any real one.
UNMEASURABLE_S = 1e30

Evaluate = Callable[[Sequence[Partition]], Cost]


def seed_genomes(groups: Sequence[OpGroup]) -> list[tuple[int, ...]]:
    """The op-level placement, and for each graph-level backend the placement giving it all it supports."""
    seeds = [tuple(KEEP for _ in groups)]
    for backend in sorted({b for g in groups for b in g.choices}):
        seeds.append(tuple(g.choices.index(backend) + 1 if backend in g.choices else KEEP for g in groups))
    return list(dict.fromkeys(seeds))


def search_two_level(
    graph: OpGraph,
    groups: Sequence[OpGroup],
    evaluate: Evaluate,
    settings: TwoLevelSettings = TwoLevelSettings(),
    on_generation: Optional[Callable[[GenerationRecord], None]] = None,
    on_best: Optional[Callable[[Sequence[Partition], Cost], None]] = None,
    spent: Optional[Callable[[], float]] = None,
    prepare: Optional[Callable[[list[Sequence[Partition]]], object]] = None,
) -> TwoLevelResult:
    """Evolve genomes (mu + lambda, elitist) from the seeds; return the fastest placement measured.

    ``evaluate`` measures a placement end to end. ``on_generation(record)`` reports each
    generation's :class:`GenerationRecord` (generation 0 included); ``on_best(parts, cost)`` is called whenever a faster
    placement is found, so a caller can save it before the search ends. ``spent()`` is what the
    budget is charged so far (default: the seconds since the search started); an evaluator
    that charges measurements read from a database at what they once took makes a search on a
    warm database stop where it stopped when it measured, and return the same placement. ``prepare(placements)``
    is handed, before the seeds and before each generation are scored, the placements about to be measured (those
    not measured nor predicted slower), for an evaluator that builds them all at once first
    (:meth:`EndToEndEvaluator.prepare`); it changes what is measured in no way.
    """
    with _seeded_global_random(settings.seed):
        return _evolve(graph, groups, evaluate, settings, on_generation, on_best, spent, prepare)


def _evolve(graph, groups, evaluate, settings, on_generation, on_best, spent, prepare=None) -> TwoLevelResult:
    started = time.perf_counter()
    if spent is None:
        spent = lambda: time.perf_counter() - started  # noqa: E731
    scores: dict[str, Cost] = {}
    counts = {"measured": 0, "evaluated": 0}
    predicted: set[str] = set()
    best: dict = {"cost": Cost.unknown(), "parts": None, "genome": None}
    predictor = LatencyPredictor(groups)

    def predicted_slower(parts) -> Optional[float]:
        """The latency predicted for ``parts`` when that is over the best by more than the margin: not built."""
        guess = predictor.predict(parts) if settings.predict_margin is not None else None
        if guess is not None and best["cost"].is_measured and guess > best["cost"].seconds * (1 + settings.predict_margin):
            return guess
        return None

    def fitness(genome: Sequence[int]) -> float:
        parts = decode(graph, groups, genome)
        key = genome_key(parts)
        counts["evaluated"] += 1
        if key not in scores:
            guess = predicted_slower(parts)
            if guess is not None:
                predicted.add(key)
                return guess
            scores[key] = evaluate(parts)
            predictor.learn(parts, scores[key])
            counts["measured"] += 1
        cost = scores[key]
        if cost.seconds < best["cost"].seconds:
            best.update(cost=cost, parts=tuple(parts), genome=tuple(genome))
            if on_best is not None:
                on_best(parts, cost)
        return cost.seconds

    def score(individuals) -> None:
        if prepare is not None:
            coming = {}
            for individual in individuals:
                if individual.fitness.valid:
                    continue
                parts = decode(graph, groups, individual)
                key = genome_key(parts)
                if key not in scores and predicted_slower(parts) is None:
                    coming.setdefault(key, parts)
            prepare(list(coming.values()))
        _score(individuals, fitness)

    toolbox = _toolbox(groups, settings)
    seeds = [_individual(genome) for genome in seed_genomes(groups)]
    score(seeds)
    # The rest start as variations of the fastest seed: random genomes of a large model are
    # almost all far slower than the seeds and would spend the budget on builds that teach nothing.
    fastest = min(seeds, key=lambda ind: (ind.fitness.values[0], tuple(ind)))
    population = list(seeds)
    while len(population) < settings.population:
        population.append(toolbox.mutate(toolbox.clone(fastest))[0])
        del population[-1].fitness.values
    score(population)
    history: list[GenerationRecord] = []

    def record(generation: int) -> None:
        counts_now = operators_by_backend(best["parts"] or decode(graph, groups, tuple(seeds[0])))
        before = history[-1].operators_by_backend if history else counts_now
        gained = {b: counts_now.get(b, 0) - before.get(b, 0) for b in set(counts_now) | set(before)}
        history.append(
            GenerationRecord(
                generation, best["cost"].seconds, settings.budget_s - spent(), counts_now, {b: n for b, n in gained.items() if n}
            )
        )
        if on_generation is not None:
            on_generation(history[-1])

    record(0)
    generation = improved_at = 0
    standing = best["cost"]  # the best at the last generation that counted as faster
    for generation in range(1, settings.generations + 1):
        # Nothing left to evolve where every genome is one placement (no operator group can go to a graph-level
        # backend): DEAP's variation needs two distinct parents.
        if spent() > settings.budget_s or len(population) < 2:
            generation -= 1
            break
        offspring = algorithms.varOr(
            population, toolbox, settings.population, settings.crossover_probability, settings.mutation_probability
        )
        score(offspring)
        population = sorted(population + offspring, key=lambda ind: (ind.fitness.values[0], tuple(ind)))
        population = _distinct(population)[: settings.population]
        record(generation)
        if beats(best["cost"], standing, settings.min_gain):
            improved_at, standing = generation, best["cost"]
        if generation - improved_at >= settings.patience:
            break
    if best["parts"] is None:
        op_level = tuple(seeds[0])
        best.update(cost=Cost.invalid("no placement could be measured"), parts=tuple(decode(graph, groups, op_level)), genome=op_level)
    return TwoLevelResult(
        best["parts"],
        best["cost"],
        best["genome"],
        counts["measured"],
        counts["evaluated"],
        generation,
        time.perf_counter() - started,
        history=tuple(history),
        predicted=len(predicted - set(scores)),
    )


def beats(new: Cost, old: Cost, min_gain: float) -> bool:
    """Whether ``new`` is faster than ``old`` by more than either's spread and by ``min_gain`` of ``old``."""
    if not new.is_measured:
        return False
    if not old.is_measured:
        return True
    return new.median_s < old.median_s - max(new.spread_s, old.spread_s, min_gain * old.median_s)


def _toolbox(groups: Sequence[OpGroup], settings: TwoLevelSettings) -> base.Toolbox:
    toolbox = base.Toolbox()
    # Two-point crossover cuts a genome at two points; a genome of one group has nowhere to cut, and mating leaves it be.
    toolbox.register("mate", tools.cxTwoPoint if len(groups) >= 2 else _unmated)
    toolbox.register("mutate", _mutate, groups=groups, probability=settings.gene_mutation_probability)
    return toolbox


def _unmated(first, second) -> tuple:
    return first, second


def _individual(genes) -> list:
    if not hasattr(creator, "CollageFitness"):
        creator.create("CollageFitness", base.Fitness, weights=(-1.0,))
        creator.create("CollageGenome", list, fitness=creator.CollageFitness)
    return creator.CollageGenome(genes)


def _score(individuals, fitness) -> None:
    for individual in individuals:
        if not individual.fitness.valid:
            value = fitness(individual)
            individual.fitness.values = (value if math.isfinite(value) else UNMEASURABLE_S,)


def _mutate(genome, groups: Sequence[OpGroup], probability: float):
    """Each gene, with ``probability``, takes a random value among those its group allows."""
    for index, group in enumerate(groups):
        if group.choices and random.random() < probability:
            genome[index] = random.randint(0, len(group.choices))
    return (genome,)


def _distinct(population) -> list:
    seen, kept = set(), []
    for individual in population:
        if tuple(individual) not in seen:
            seen.add(tuple(individual))
            kept.append(individual)
    return kept


@contextlib.contextmanager
def _seeded_global_random(seed: int):
    """DEAP's operators draw from the ``random`` module: seed it for the search, then give it back."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)
