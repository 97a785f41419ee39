"""The models ``sampling-course bench-speculative`` measures, and how each method runs on them.

``load_pair`` gives the target and the draft: the story models when both load, else a
stand-in pair, labelled as such (the offline stand-in ``"tiny"`` drafted by its own first
layer), or tiny random models for ``--quick``. Each method generates exactly ``n`` tokens
from a prompt of token ids: ``ours_speculative`` (the chosen implementation's
``speculative_generate``), ``ours_lookup`` (the same with prompt-lookup drafting instead of
the draft model) and ``ours_cached`` (target-only or draft-only cached generation), each
on part 4's dynamic cache or part 6's static cache (prompt lookup: the dynamic one), and
``hf_generate`` (plain, assisted or prompt-lookup Hugging Face ``generate``, its target
forwards counted). ``verify_cost`` measures the cost of one verifying target forward.
``sampling_course.apps.bench_speculative`` checks, times and reports them.
"""

from __future__ import annotations

import copy
import importlib
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sampling_course.apps.bench_setup import IdTokenizer
from sampling_course.devices import synchronize

# The quick smoke run: a GPT-2 architecture small enough to run in a second or two.
QUICK_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=256)
STAND_IN_PROMPTS = ["Once upon a time", "The cat sat on the", "When I was a kid"]


@dataclass
class Pair:
    """A target and a draft, as DemoTransformers (ours) and GPT2LMHeadModels (Hugging Face's)."""

    label: str
    stand_in: bool
    target: torch.nn.Module
    draft: torch.nn.Module
    hf_target: torch.nn.Module
    hf_draft: torch.nn.Module
    prompts: list[list[int]]
    impl: str
    tokenizer: object  # the models' tokenizer (an IdTokenizer for the random smoke-run models)

    @property
    def n_ctx(self) -> int:
        return min(self.target.cfg.n_ctx, self.draft.cfg.n_ctx)

    @property
    def device(self) -> torch.device:
        """Where all four models compute."""
        return next(self.target.parameters()).device



# ---------------------------------------------------------------------------------------
# The pair
# ---------------------------------------------------------------------------------------


def first_layers_hf(hf_model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """A GPT2LMHeadModel made of ``hf_model``'s embeddings, its first ``n_layers`` blocks, ln_f and head."""
    from transformers import GPT2LMHeadModel

    config = hf_model.config.__class__.from_dict({**hf_model.config.to_dict(), "n_layer": n_layers})
    draft = GPT2LMHeadModel(config)
    state = {
        k: v.cpu() for k, v in hf_model.state_dict().items()
        if not k.startswith("transformer.h.") or int(k.split(".")[2]) < n_layers
    }
    draft.load_state_dict(state, strict=True)
    return draft.eval()


def _demo(hf_model: torch.nn.Module, transformer_module) -> torch.nn.Module:
    from sampling_course.config import Config
    from sampling_course.weights import demo_state_dict

    demo = transformer_module.DemoTransformer(Config.from_hf(hf_model.config))
    demo.load_state_dict({k: v.cpu() for k, v in demo_state_dict(hf_model).items()}, strict=True)
    return demo.eval()


def load_pair(impl: str = "solutions", quick: bool = False, seed: int = 0, device: str | torch.device | None = None) -> Pair:
    """The story pair when it loads, else the stand-in pair (``quick``: tiny random models), on
    ``device`` (the course's device when None)."""
    from sampling_course.devices import pick_device

    device = pick_device(device)
    pair = _load_pair(impl, quick, seed, device)
    # Ours are built on the CPU from the Hugging Face models' weights; all four compute on `device`.
    for model in (pair.target, pair.draft, pair.hf_target, pair.hf_draft):
        model.to(device)
    return pair


def _load_pair(impl: str, quick: bool, seed: int, device: torch.device) -> Pair:
    from sampling_course.reference import ReferenceUnavailable, load_reference

    transformer = importlib.import_module(f"{impl}.transformer")
    if quick:
        from sampling_course.apps.bench_setup import random_gpt2

        hf_target = random_gpt2(QUICK_DIMS, seed)
        hf_draft = first_layers_hf(hf_target, 1)
        generator = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, QUICK_DIMS["vocab_size"], (6,), generator=generator, device="cpu").tolist()]
        label = "smoke run: random 2-layer GPT-2 (d_model 64, vocab 256), draft = its first layer"
        return Pair(
            label, True, _demo(hf_target, transformer), _demo(hf_draft, transformer), hf_target, hf_draft, prompts, impl,
            IdTokenizer(),
        )
    try:
        target_ref = load_reference("story", device, quiet=True)
        draft_ref = load_reference("story-draft", device, quiet=True)
    except (ReferenceUnavailable, ValueError) as exc:  # not built here, or a version of the course without them
        reason = str(exc).split(";")[0]
    else:
        tokenizer = target_ref.tokenizer
        # Every story starts after an end-of-text token: a prompt of that token alone starts a new story.
        prompts = [[tokenizer.eos_token_id]] * 3
        cfg_t, cfg_d = target_ref.cfg, draft_ref.cfg
        label = (
            f"story ({cfg_t.n_layers} layers, d_model {cfg_t.d_model}) drafted by story-draft "
            f"({cfg_d.n_layers} layers, d_model {cfg_d.d_model})"
        )
        return Pair(
            label, False, _demo(target_ref.hf_model, transformer), _demo(draft_ref.hf_model, transformer),
            target_ref.hf_model, draft_ref.hf_model, prompts, impl, tokenizer,
        )
    tiny = load_reference("tiny", device)
    hf_draft = first_layers_hf(tiny.hf_model, 1)
    prompts = [tiny.tokenizer.encode(text) for text in STAND_IN_PROMPTS]
    label = (
        f"STAND-IN PAIR (the story models are not available: {reason}): target 'tiny' "
        f"({tiny.cfg.n_layers} layers, d_model {tiny.cfg.d_model}, random weights), draft = its first layer"
    )
    return Pair(
        label, True, _demo(tiny.hf_model, transformer), _demo(hf_draft, transformer), tiny.hf_model, hf_draft, prompts,
        impl, tiny.tokenizer,
    )


# ---------------------------------------------------------------------------------------
# The methods
# ---------------------------------------------------------------------------------------


def cache_class(pair: Pair, cache: str):
    """``"dynamic"``: part 4's KeyValueCache; ``"static"``: part 6's StaticKeyValueCache (of the pair's implementation)."""
    if cache == "dynamic":
        return importlib.import_module(f"{pair.impl}.kv_cache").KeyValueCache
    if cache == "static":
        return importlib.import_module(f"{pair.impl}.caches").StaticKeyValueCache
    raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")


def ours_speculative(
    pair: Pair, prompt: list[int], n: int, gamma: int, temperature: float, seed: int, cache: str = "dynamic"
):
    """``speculative_generate`` with both models on ``cache`` caches (see ``cache_class``)."""
    speculative_loop = importlib.import_module(f"{pair.impl}.speculative_loop")
    tokenizer = IdTokenizer()
    text, stats = speculative_loop.speculative_generate(
        pair.target, pair.draft, tokenizer, tokenizer.decode(prompt), n,
        gamma=gamma, temperature=temperature, seed=seed, return_stats=True, cache_class=cache_class(pair, cache),
    )
    return tokenizer.encode(text), stats


def ours_lookup(pair: Pair, prompt: list[int], n: int, gamma: int, temperature: float, seed: int):
    """speculative_generate with prompt-lookup drafting (no draft model), gamma tokens at most per round."""
    speculative_loop = importlib.import_module(f"{pair.impl}.speculative_loop")
    tokenizer = IdTokenizer()
    text, stats = speculative_loop.speculative_generate(
        pair.target, None, tokenizer, tokenizer.decode(prompt), n,
        prompt_lookup_num_tokens=gamma, temperature=temperature, seed=seed, return_stats=True,
    )
    return tokenizer.encode(text), stats


def ours_cached(
    pair: Pair, model: torch.nn.Module, prompt: list[int], n: int, temperature: float, seed: int, cache: str = "dynamic"
) -> list[int]:
    """Target-only (or draft-only) cached generation with TransformerSampler.sample, on a ``cache`` cache."""
    sampling = importlib.import_module(f"{pair.impl}.sampling")
    tokenizer = IdTokenizer()
    sampler = sampling.TransformerSampler(model, tokenizer)
    text = sampler.sample(
        tokenizer.decode(prompt), n, temperature=temperature, seed=seed,
        kv_cache=cache_class(pair, cache).new_empty(model.cfg),
    )
    return tokenizer.encode(text)


class ForwardCounter:
    """Counts the forward calls of a Hugging Face model while active."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.calls = model, 0

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._count)
        return self

    def _count(self, *_):
        self.calls += 1

    def __exit__(self, *exc):
        self.handle.remove()


@contextmanager
def generation_configs_without_eos(pair: Pair):
    """Give both Hugging Face models, for the duration, a copy of their generation config with no EOS.

    ``generate`` fills every setting left at None in the config it is given from the
    model's own ``generation_config``, so ``eos_token_id=None`` alone still stops at the
    story models' end-of-text token; assisted generation also lets the draft stop at it.
    The copies go, and the shared reference models' configs come back, on exit.
    """
    models = (pair.hf_target, pair.hf_draft)
    saved = [model.generation_config for model in models]
    try:
        for model, config in zip(models, saved):
            model.generation_config = copy.deepcopy(config)
            model.generation_config.eos_token_id = None
        yield
    finally:
        for model, config in zip(models, saved):
            model.generation_config = config


def hf_generate(pair: Pair, prompt: list[int], n: int, temperature: float, seed: int, gamma: int | None = None,
                lookup: bool = False):
    """Plain, assisted or (``lookup``) prompt-lookup ``hf_target.generate`` of exactly ``n`` tokens; returns (ids,
    number of target forwards)."""
    from transformers import GenerationConfig

    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    config = GenerationConfig(max_new_tokens=n, eos_token_id=None, pad_token_id=0, use_cache=True, **sampling)
    input_ids = torch.tensor([prompt], device=pair.device)
    with generation_configs_without_eos(pair):
        extra = {}
        if lookup:
            extra["prompt_lookup_num_tokens"] = gamma
        elif gamma is not None:
            assistant = pair.hf_draft.generation_config  # the copy: the settings go with it
            assistant.num_assistant_tokens = gamma
            assistant.num_assistant_tokens_schedule = "constant"
            assistant.assistant_confidence_threshold = 0.0  # draft exactly gamma tokens, like the textbook rule
            extra["assistant_model"] = pair.hf_draft
        torch.manual_seed(seed)
        with torch.inference_mode(), ForwardCounter(pair.hf_target) as counter:
            out = pair.hf_target.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **extra)
    return out[0].tolist(), counter.calls


@torch.inference_mode()
def verify_cost(pair: Pair, gammas: list[int], repeats: int = 10) -> dict[int, float]:
    """Time of one cached target forward over gamma + 1 new positions, over the time of one over 1
    position: the medians of ``repeats`` interleaved rounds (each round times every size once, so
    a slow spell of the machine falls on all of them alike)."""
    KeyValueCache = importlib.import_module(f"{pair.impl}.kv_cache").KeyValueCache
    prompt = pair.prompts[0]
    length = min(pair.n_ctx, len(prompt) + 64)
    tokens = torch.tensor([(prompt * length)[:length]], device=pair.device)
    sizes = sorted({1, *(gamma + 1 for gamma in gammas)})
    caches = {new: pair.target(tokens[:, : length - new], KeyValueCache.new_empty(pair.target.cfg))[1] for new in sizes}
    times: dict[int, list[float]] = {new: [] for new in sizes}
    for _ in range(repeats):
        for new in sizes:
            synchronize(pair.device)  # a GPU runs its work later: time it from an idle device to a finished one
            start = time.perf_counter()
            pair.target(tokens, caches[new])
            synchronize(pair.device)
            times[new].append(time.perf_counter() - start)
    median = {new: statistics.median(seconds) for new, seconds in times.items()}
    return {gamma: median[gamma + 1] / median[1] for gamma in gammas}
