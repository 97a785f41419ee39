"""The course walked in order: for each exercise, the solutions with every exercise up to it
solved and every later one still a stub, as a learner who works through the course has them.

Each solution region (``### BEGIN SOLUTION`` ... ``### END SOLUTION``) belongs to one
exercise: the one whose target is the most specific name holding the region (a region in
``DemoTransformer.padded_forward`` belongs to ``padded_forward``, not to ``DemoTransformer``);
when several exercises share that target, the first in course order, unless the region is
listed in ``LATER_OWNERS`` (``TransformerSampler.sample``'s cached branch is part 4's).
``walk_sources(k)`` keeps the regions of the first ``k + 1`` exercises and replaces every
other region with its stub, exactly as ``grading/stubs.py`` makes ``exercises/``.

``sampling-course``'s planter judges a ``Step`` (``grading/mistakes.py``): it grades exercise
``k`` on that package (every test must pass: none may need a later exercise), and exercise
``k + 1``, whose stub must be the one its tests run into.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from sampling_course.grading.catalogue import Exercise
from sampling_course.grading.course import EXERCISES, get_exercise
from sampling_course.grading.planting import solution_sources
from sampling_course.grading.stubs import BEGIN_MARKER, END_MARKER, make_stub_source

__all__ = ["LATER_OWNERS", "Region", "Step", "region_owner", "regions", "regions_in", "walk_sources"]

# Regions that a later exercise sharing its target owns: (module, a line inside the region) -> exercise.
# The cached branch of TransformerSampler.sample is written in part 4 (cached_sample), not in part 2.
LATER_OWNERS = {
    ("sampling", "logits, kv_cache = self.model(input_ids[None], kv_cache)"): "cached_sample",
    # DemoTransformer.forward is cached_forward's target, but its cache-free body is part 1's.
    ("transformer", "residual = block(residual)"): "DemoTransformer",
    # The cache's hook in Attention.forward (part 4) and what the cache hides (part 5).
    ("transformer", "k, v = cache.update(k, v)"): "cached_forward",
    ("transformer", "attn_scores.masked_fill(~cache.mask, self.IGNORE)"): "masked_forward",
    # Part 4's cache as a cache of the protocol: its positions and its concatenation.
    ("kv_cache", "positions = torch.arange(past, tokens.shape[1]"): "cached_forward",
    ("kv_cache", "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)"): "cached_forward",
}


@dataclass(frozen=True)
class Region:
    """One solution region of ``solutions/<module>.py``: its lines (1-based, markers included) and owner."""

    module: str
    begin: int
    end: int
    holder: str  # the qualified name of the function or class holding it
    owner: Exercise | None


@dataclass(frozen=True)
class Step:
    """One step of the walk: every exercise up to ``EXERCISES[index]`` solved, every later one a stub.

    ``index`` -1 is the untouched exercises (only the first exercise's stub is graded there).
    """

    index: int

    @property
    def graded(self) -> Exercise | None:
        """The exercise whose tests must all pass on this step's package."""
        return EXERCISES[self.index] if self.index >= 0 else None

    @property
    def next(self) -> Exercise | None:
        """The exercise still a stub right after, whose tests must run into its own stub."""
        return EXERCISES[self.index + 1] if self.index + 1 < len(EXERCISES) else None


def _holders(source: str) -> list[tuple[str, int, int]]:
    spans: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, names: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                spans.append((".".join(names + (child.name,)), child.lineno, child.end_lineno or child.lineno))
                visit(child, names + (child.name,))
            else:
                visit(child, names)

    visit(ast.parse(source), ())
    return spans


def region_owner(module: str, holder: str, body: str) -> Exercise | None:
    """The exercise a region of ``module`` inside ``holder`` (qualified name) with text ``body`` belongs to."""
    for (owner_module, line), name in LATER_OWNERS.items():
        if owner_module == module and line in body:
            return get_exercise(name)
    candidates = [e for e in EXERCISES if e.module == module and (holder == e.target or holder.startswith(e.target + "."))]
    if not candidates:
        return None
    most_specific = max(e.target.count(".") for e in candidates)
    return next(e for e in candidates if e.target.count(".") == most_specific)


@lru_cache(maxsize=None)
def regions(module: str) -> tuple[Region, ...]:
    """Every solution region of ``solutions/<module>.py``, in file order, with its owner."""
    return regions_in(module, solution_sources()[module])


def regions_in(module: str, source: str) -> tuple[Region, ...]:
    """Every solution region of ``source``, read as the course's module ``module``, in file order, with its owner."""
    lines = source.splitlines()
    spans = _holders(source)
    found: list[Region] = []
    begin = None
    for number, line in enumerate(lines, start=1):
        if line.strip() == BEGIN_MARKER:
            begin = number
        elif line.strip() == END_MARKER and begin is not None:
            holder = max((name for name, a, b in spans if a <= begin <= b), key=lambda n: n.count("."), default="")
            body = "\n".join(lines[begin - 1:number])
            found.append(Region(module, begin, number, holder, region_owner(module, holder, body)))
            begin = None
    return tuple(found)


def walk_sources(index: int) -> dict[str, str]:
    """The sources of ``solutions/`` with the regions of ``EXERCISES[:index + 1]`` kept and every other stubbed."""
    solved = set(EXERCISES[:index + 1])
    sources = solution_sources()
    for module, source in sources.items():
        stubbed = [r for r in regions(module) if r.owner not in solved]
        if not stubbed:
            continue
        lines = source.splitlines(keepends=True)
        for region in reversed(stubbed):  # from the end, so earlier line numbers stay valid
            text = "".join(lines[region.begin - 1:region.end])
            lines[region.begin - 1:region.end] = [make_stub_source(text, f"solutions/{module}.py")]
        sources[module] = "".join(lines)
    return sources
