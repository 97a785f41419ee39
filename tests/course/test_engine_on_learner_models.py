"""Part 10's engine runs the learner's own model: the model of parts 1 and 4, through its one forward pass, with the
paged cache as its cache. So every correct way of writing part 1 must serve the same tokens as part 5's ``generate``.

Each group of part 1's planted correct variants (``grading.mistakes.downstream_groups``: at most one per exercise,
planted together, as one learner's ``transformer.py`` would be) is planted into a copy of the solutions; the copy's
engine serves greedy and seeded requests together, with prompts cut into chunks, and each request must get the
tokens ``generate`` gives it alone on the same model. (``plant-mistakes`` also runs part 10's tests marked
``downstream`` on every group.)
"""

from __future__ import annotations

import pytest

from sampling_course.grading.course import VARIANTS
from sampling_course.grading.mistakes import downstream_groups
from sampling_course.grading.planting import planted, planted_sources
from sampling_course.implementation import Impl, load_demo
from sampling_course.sampling_settings import SamplerSettings

def plants(variant) -> bool:
    """Whether the variant's text is in solutions/ as it is now (a home not yet moved to the one forward pass: not)."""
    try:
        planted_sources(variant)
        return True
    except ValueError:
        return False


PART_1 = [variant for variant in VARIANTS if variant.part == 1]
GROUPS = [group for group in downstream_groups([v for v in PART_1 if plants(v)]) if group.part == 1]
PROMPTS = ["Once upon a time", "The cat sat on the mat, and then", "A short one"]
JOBS = [(p, SamplerSettings(temperature=0.0), None) for p in PROMPTS] + [
    (p, SamplerSettings(temperature=0.9, top_k=20), 7 + i) for i, p in enumerate(PROMPTS)]


def test_part_1_has_correct_variants_that_plant():
    """Most of part 1's variants plant on the one forward pass (those that do not are left out of GROUPS)."""
    assert GROUPS and 2 * sum(len(group.variants) for group in GROUPS) >= len(PART_1), (
        f"only {sum(len(group.variants) for group in GROUPS)} of part 1's {len(PART_1)} correct variants plant")


@pytest.mark.parametrize("group", GROUPS, ids=lambda group: group.name[:60])
def test_the_engine_serves_a_learner_style_model_with_generate_s_tokens(tiny, group):
    with planted(*group.variants) as package:
        impl = Impl(package)
        model = load_demo(tiny, impl.transformer)
        tok = tiny.tokenizer
        engine = impl.engine.Engine(model, n_blocks=48, block_size=4, max_running=4, max_step_tokens=6)
        served = [engine.add_request(tok.encode(p), 6, settings, seed) for p, settings, seed in JOBS]
        engine.run()
        assert engine.pool.n_free == engine.pool.n_blocks, "blocks left held at the end"
        for (prompt, settings, seed), request in zip(JOBS, served):
            n = len(tok.encode(prompt))
            alone = impl.generate.generate(model, tok, [prompt], 6, settings=settings, seed=seed, eos_token_id=-1)
            assert request.output == alone[0, n:].tolist(), f"{group.name}: {prompt!r} (seed {seed})"
