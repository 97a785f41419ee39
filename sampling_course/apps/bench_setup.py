"""What ``sampling-course bench`` times: the models, the prompts and the decoding methods.

``build`` makes the models (real GPT-2 small when cached, else GPT-2 small's dimensions
with random weights, or a tiny random GPT-2 for ``--quick``) and the prompts; ``methods``
lists every way of decoding that the bench times, each a ``run(new_tokens)`` that returns
the sequences it generated. ``sampling_course.apps.bench`` checks, times and reports them.

Prompts are token ids, written as text by ``IdTokenizer`` ("464 3290 318"): random weights
have no tokenizer, and with real GPT-2 the prompt is encoded once and then passed as ids.
``bench-speculative`` uses the same ``IdTokenizer`` and ``random_gpt2``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

# A text for the real-GPT-2 prompt (its first 32 tokens are used).
GPT2_PROMPT_TEXT = (
    "The history of the city begins with a small settlement on the river, where traders from the "
    "north and the south met every spring to exchange wool, salt and iron. Over the following "
    "centuries the market grew into a town"
)
# The quick smoke run: a GPT-2 architecture small enough to run in a second or two.
QUICK_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=1024)


class IdTokenizer:
    """A stand-in tokenizer whose text is token ids: "464 3290 318" <-> tensor([[464, 3290, 318]]).

    ``eos_token_id`` is -1, an id no model produces, so generation never stops early and
    every run generates exactly the number of tokens asked for.
    """

    eos_token_id = -1

    def encode(self, text: str, return_tensors: str | None = None):
        ids = [int(token) for token in text.split()]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def decode(self, ids) -> str:
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return " ".join(str(i) for i in ids)


@dataclass
class Method:
    """One way of decoding: ``run(new_tokens)`` returns the sequences it generated, as lists of ids."""

    task: str  # "greedy", "beam" or "batched"
    name: str  # "uncached", "cached", "static", "engine" or "hf"
    label: str
    run: Callable[[int], list]
    times: list[float] = field(default_factory=list)  # wall seconds of each timed round
    cpu_times: list[float] = field(default_factory=list)  # CPU seconds of the process in the same rounds


@dataclass
class Setup:
    model_name: str
    hf_model: torch.nn.Module
    demo: torch.nn.Module
    impl: str
    prompt_ids: list[int]
    new_tokens: int
    beam_new_tokens: int
    num_beams: int
    batch_prompts: list[list[int]]  # the batched task's prompts, of different lengths
    batch_new_tokens: int


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def random_gpt2(dims: dict, seed: int) -> torch.nn.Module:
    """A GPT2LMHeadModel with Hugging Face's own random initialisation (seeded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from sampling_course.reference import quiet_transformers

    quiet_transformers()
    config = GPT2Config(**dims)
    # Keep the special ids inside the vocabulary (they are never used: see IdTokenizer).
    config.bos_token_id = config.eos_token_id = config.vocab_size - 1
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


def build(args: argparse.Namespace) -> Setup:
    from sampling_course.config import Config
    from sampling_course.reference import quiet_transformers, gpt2_local_dir
    from sampling_course.weights import demo_state_dict

    generator = torch.Generator().manual_seed(args.seed)
    local = None if args.quick or args.model == "random" else gpt2_local_dir()
    if args.model == "gpt2" and local is None:
        raise SystemExit(
            "real GPT-2 small is not in the local Hugging Face cache; run `sampling-course download-gpt2` "
            "or use --model random"
        )
    if local is not None:
        from transformers import GPT2LMHeadModel, GPT2TokenizerFast

        quiet_transformers()
        hf_model = GPT2LMHeadModel.from_pretrained(local, local_files_only=True).eval()
        tokenizer = GPT2TokenizerFast.from_pretrained(local, local_files_only=True)
        prompt_ids = tokenizer(GPT2_PROMPT_TEXT).input_ids[: args.prompt_tokens]
        text_ids = tokenizer(GPT2_PROMPT_TEXT).input_ids
        model_name = "GPT-2 small (real weights)"
    else:
        dims = QUICK_DIMS if args.quick else {}
        hf_model = random_gpt2(dims, args.seed)
        vocab = hf_model.config.vocab_size
        prompt_ids = torch.randint(0, vocab, (args.prompt_tokens,), generator=generator).tolist()
        text_ids = torch.randint(0, vocab, (4 * args.prompt_tokens,), generator=generator).tolist()
        model_name = "tiny random GPT-2 (smoke run)" if args.quick else "GPT-2 small dimensions, random weights"
    if len(prompt_ids) != args.prompt_tokens:
        raise SystemExit(f"the prompt has {len(prompt_ids)} tokens, not {args.prompt_tokens}")
    hf_model = hf_model.float()
    # generate() fills every setting left at None from the model's own config: take its EOS away there.
    hf_model.generation_config.eos_token_id = None
    transformer = importlib.import_module(f"{args.impl}.transformer")
    demo = transformer.DemoTransformer(Config.from_hf(hf_model.config))
    demo.load_state_dict(demo_state_dict(hf_model), strict=True)
    # Part 6's fast path: QKV fused once, at load (before part 6, fuse_qkv is a stub: the model runs as written).
    try:
        importlib.import_module(f"{args.impl}.fast_path").fuse_at_load(demo)
    except NotImplementedError:
        pass
    batch_prompts = batch_of_prompts(text_ids, args.batch_size, args.prompt_tokens, generator)
    total = args.prompt_tokens + max(args.new_tokens, args.beam_new_tokens, args.batch_new_tokens)
    if total > demo.cfg.n_ctx:
        raise SystemExit(f"prompt + new tokens = {total} is more than the model's n_ctx={demo.cfg.n_ctx}")
    return Setup(
        model_name, hf_model, demo.eval(), args.impl, prompt_ids, args.new_tokens, args.beam_new_tokens, args.num_beams,
        batch_prompts, args.batch_new_tokens,
    )


def batch_of_prompts(text_ids: list[int], batch: int, longest: int, generator: torch.Generator) -> list[list[int]]:
    """``batch`` windows of ``text_ids`` with lengths from ``longest // 2`` to ``longest``: the longest
    first, so the batch is always exactly ``longest`` wide, the others at random lengths."""
    lengths = [longest] + torch.randint(max(1, longest // 2), longest + 1, (batch - 1,), generator=generator).tolist()
    starts = torch.randint(0, len(text_ids) - longest + 1, (batch,), generator=generator).tolist()
    return [text_ids[start : start + n] for start, n in zip(starts, lengths)]


def left_pad_ids(prompts: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Hugging Face's input for a batch: ids left-padded with ``pad``, and the attention mask."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


# ---------------------------------------------------------------------------------------
# The methods
# ---------------------------------------------------------------------------------------


def methods(setup: Setup) -> list[Method]:
    """The methods; each ``run(new_tokens)`` returns its sequences (prompt included) as id lists."""
    from transformers import GenerationConfig

    sampling = importlib.import_module(f"{setup.impl}.sampling")
    engine = importlib.import_module(f"{setup.impl}.generate")
    KeyValueCache = importlib.import_module(f"{setup.impl}.kv_cache").KeyValueCache
    StaticKeyValueCache = importlib.import_module(f"{setup.impl}.caches").StaticKeyValueCache
    cfg = setup.demo.cfg
    tokenizer = IdTokenizer()
    sampler = sampling.TransformerSampler(setup.demo, tokenizer)
    prompt = tokenizer.decode(setup.prompt_ids)
    input_ids = torch.tensor([setup.prompt_ids])
    beams = setup.num_beams

    def hf_generate(new_tokens: int, ids: Tensor = input_ids, mask: Tensor | None = None, **beam_settings) -> list:
        # eos_token_id=None: no token ends a sequence, as with IdTokenizer.
        config = GenerationConfig(
            max_new_tokens=new_tokens, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0,
            **beam_settings,
        )
        mask = torch.ones_like(ids) if mask is None else mask
        with torch.inference_mode():
            out = setup.hf_model.generate(ids, attention_mask=mask, generation_config=config)
        return out.tolist()

    # The batched task: the engine left-pads with id 0 (IdTokenizer has no pad and no valid EOS), as HF is told to.
    batch_texts = [tokenizer.decode(p) for p in setup.batch_prompts]
    batch_ids, batch_mask = left_pad_ids(setup.batch_prompts, pad=0)

    def engine_generate(new_tokens: int, kv_cache=None) -> list:
        return engine.generate(setup.demo, tokenizer, batch_texts, new_tokens, temperature=0.0, kv_cache=kv_cache).tolist()

    def static(new_tokens: int, batch: int = 1, prompt_len: int = len(setup.prompt_ids)):
        """A static cache sized for exactly this run, as a generator that knows its lengths would allocate it."""
        return StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=prompt_len + new_tokens)

    def greedy(new_tokens: int, kv_cache=None) -> list:
        return [tokenizer.encode(sampler.sample(prompt, new_tokens, temperature=0, kv_cache=kv_cache))]

    def beam_search(new_tokens: int, kv_cache=None) -> list:
        found = sampler.beam_search(prompt, beams, beams, new_tokens, kv_cache=kv_cache)
        return [tokenizer.encode(text) for _, text in found]

    # Summed log-probs for all beams, as in beam_search: no length penalty, and no early stop.
    hf_beams = dict(num_beams=beams, num_return_sequences=beams, length_penalty=0.0, early_stopping="never")
    return [
        Method("greedy", "uncached", "uncached", lambda n: greedy(n)),
        Method("greedy", "cached", "KV cache", lambda n: greedy(n, KeyValueCache.new_empty(cfg))),
        Method("greedy", "static", "static cache", lambda n: greedy(n, static(n))),
        Method("greedy", "hf", "HF generate", lambda n: hf_generate(n)),
        Method("beam", "uncached", "uncached", lambda n: beam_search(n)),
        Method("beam", "cached", "KV cache", lambda n: beam_search(n, KeyValueCache.new_empty(cfg))),
        Method("beam", "static", "static cache", lambda n: beam_search(n, static(n, batch=beams))),
        Method("beam", "hf", "HF generate", lambda n: hf_generate(n, **hf_beams)),
        Method("batched", "engine", "engine generate", engine_generate),
        Method("batched", "static", "engine, static cache",
                lambda n: engine_generate(n, static(n, len(batch_texts), batch_ids.shape[1]))),
        Method("batched", "hf", "HF generate", lambda n: hf_generate(n, batch_ids, batch_mask)),
    ]
