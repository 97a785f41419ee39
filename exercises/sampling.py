# GENERATED from solutions/sampling.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 35d35f3a5c9ff40e4df1e0a6b0b236729b69f8daad101f8cf7b7d0bf5f4a6052
"""Part 2: sampling from a language model, one token at a time.

A model gives logits for the next token; a decoding method turns them into a choice.
``TransformerSampler.sample`` runs the loop, ``sample_next_token`` picks the method, and
each method is a small static function you can test on hand-made logits:

    logits -> temperature -> frequency penalty -> top-k or top-p -> draw a token

Each method takes one position's logits, shape ``(d_vocab,)``, and returns the chosen
token id as a Python ``int``. (Part 5 batches the same ideas over many sequences.)

The settings follow the classic sampler's contract: ``top_k=0`` and ``top_p=0.0`` (the
defaults) mean no filter, and at most one of them is set. Parts 5 and 7 follow Hugging
Face instead, where ``top_p=1.0`` is off and ``top_p=0.0`` is refused.

Part 3 adds ``beam_search`` and part 4 passes a KV cache through both loops.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .beams import BeamHypotheses, Beams
from .kv_cache import KeyValueCache
from .transformer import DemoTransformer


class TransformerSampler:
    def __init__(self, model: DemoTransformer, tokenizer):
        self.model = model
        self.cfg = model.cfg
        self.tokenizer = tokenizer
        # Where new token tensors must live: the model's device (CPU for a parameter-free stand-in).
        self.device = next(model.parameters(), torch.empty(0)).device

    @torch.inference_mode()
    def sample(
        self,
        prompt: str,
        max_tokens_generated: int = 100,
        verbose: bool = False,
        kv_cache: KeyValueCache | None = None,
        **kwargs,
    ) -> str:
        """Continue ``prompt`` until ``max_tokens_generated`` tokens or the end-of-text token.

        ``kwargs`` go to ``sample_next_token`` (temperature, top_k, top_p,
        frequency_penalty; in the classic contract, ``top_k=0`` and ``top_p=0.0`` are
        off); ``seed`` seeds torch's generator once, before the first token.
        Returns the prompt plus the continuation, decoded (including a final EOS if one
        was generated). ``verbose=True`` prints the text as it grows.

        With ``kv_cache`` (an empty ``KeyValueCache``), each step runs only the newest
        token through the model. A cache cannot slide past the model's n_ctx (its keys
        were computed at their positions), so then the prompt plus the generated tokens
        must fit in n_ctx: the cache raises a ValueError that says so. Without a cache the
        model simply sees the last n_ctx tokens at every step.
        """
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string")
        if not isinstance(max_tokens_generated, int) or max_tokens_generated < 0:
            raise ValueError(f"max_tokens_generated must be an integer >= 0, got {max_tokens_generated!r}")
        seed = kwargs.pop("seed", None)
        check_sampling_args(self.cfg.d_vocab, **kwargs)
        if seed is not None:
            torch.manual_seed(seed)

        input_ids = self.tokenizer.encode(prompt, return_tensors="pt")[0].to(self.device)
        if verbose:
            print(prompt, end="", flush=True)
        for _ in range(max_tokens_generated):
            if kv_cache is None:
                raise NotImplementedError()
            else:
                # Hint: pass the whole sequence; the cache knows which positions are new.
                raise NotImplementedError()
            raise NotImplementedError()
            if verbose:  # show the text as it grows
                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)
            raise NotImplementedError()
        if verbose:
            print()
        return self.tokenizer.decode(input_ids)

    @staticmethod
    def sample_next_token(
        input_ids: Int[Tensor, "seq_len"],
        logits: Float[Tensor, "d_vocab"],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
    ) -> int:
        """Pick the next token from one position's logits.

        Temperature 0 is greedy decoding (the other settings are then ignored). Otherwise
        apply the temperature, then the frequency penalty, then top-k or top-p (at most
        one of them), then draw. ``seed`` reseeds torch's generator before the draw.
        The classic contract: ``top_k=0`` and ``top_p=0.0`` (the defaults) are off. (Part
        5's engine follows Hugging Face, where ``top_p=1.0`` is off.)
        """
        check_sampling_args(logits.shape[-1], temperature, top_k, top_p, frequency_penalty)
        if input_ids.ndim != 1 or logits.ndim != 1:
            raise ValueError(
                f"input_ids must be 1-D (seq_len,) and logits 1-D (d_vocab,), got shapes "
                f"{tuple(input_ids.shape)} and {tuple(logits.shape)}"
            )
        if seed is not None:
            torch.manual_seed(seed)
        raise NotImplementedError()

    @staticmethod
    def greedy_search(logits: Float[Tensor, "d_vocab"]) -> int:
        """The most likely token (the first one, if several tie)."""
        raise NotImplementedError()

    @staticmethod
    def apply_temperature(logits: Float[Tensor, "d_vocab"], temperature: float) -> Float[Tensor, "d_vocab"]:
        """Divide the logits by the temperature: below 1 sharpens, above 1 flattens."""
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 here (use greedy_search for 0), got {temperature!r}")
        raise NotImplementedError()

    @staticmethod
    def apply_frequency_penalty(
        input_ids: Int[Tensor, "seq_len"], logits: Float[Tensor, "d_vocab"], freq_penalty: float
    ) -> Float[Tensor, "d_vocab"]:
        """Subtract ``freq_penalty`` once for every occurrence of each token in ``input_ids``."""
        # Hint: torch.bincount counts every token id in one call.
        raise NotImplementedError()

    @staticmethod
    def sample_basic(logits: Float[Tensor, "d_vocab"]) -> int:
        """Draw one token from softmax(logits)."""
        raise NotImplementedError()

    @staticmethod
    def sample_top_k(logits: Float[Tensor, "d_vocab"], k: int) -> int:
        """Draw from the ``k`` most likely tokens only, renormalised."""
        if not 1 <= k <= logits.shape[-1]:
            raise ValueError(f"k must be between 1 and d_vocab={logits.shape[-1]}, got {k!r}")
        raise NotImplementedError()

    @staticmethod
    def sample_top_p(logits: Float[Tensor, "d_vocab"], top_p: float, min_tokens_to_keep: int = 1) -> int:
        """Nucleus sampling: draw from the smallest set of top tokens whose probability is >= top_p.

        The cutoff is inclusive: the token that takes the running total to ``top_p`` or
        past it is kept. At least ``min_tokens_to_keep`` tokens are always kept.
        """
        if not 0.0 <= top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {top_p!r}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep!r}")
        # Hint: keep a token when the probability of the tokens ranked above it is still < top_p,
        # Hint: that is, when the mass from it down to the end of the list is > 1 - top_p.
        raise NotImplementedError()

    @torch.inference_mode()
    def beam_search(
        self,
        prompt: str,
        num_return_sequences: int,
        num_beams: int,
        max_new_tokens: int,
        no_repeat_ngram_size: int | None = None,
        kv_cache: KeyValueCache | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
    ) -> list[tuple[float, str]]:
        """The ``num_return_sequences`` most likely continuations found by beam search.

        Each step grows every beam by its ``num_beams`` best next tokens, then keeps the
        ``num_beams`` best of all of them. Beams that end in EOS are set aside as finished;
        once ``num_return_sequences`` have finished they are returned. Otherwise the
        finished beams come first, followed by the best unfinished ones.
        Returns (summed log-probability of the generated tokens, decoded text) pairs.

        With ``length_penalty`` or ``early_stopping`` set, it runs Hugging Face's beam search
        instead (``length_normalised_beam_search``; the other one defaults to Hugging Face's
        default, 1.0 or False): beams are refilled after one finishes, finished beams are
        ranked by ``BeamHypotheses``' length-normalised score, and the pairs hold that score.
        """
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string")
        if num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {num_beams!r}")
        if not 1 <= num_return_sequences <= num_beams:
            raise ValueError(
                f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences!r}"
            )
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens!r}")
        if no_repeat_ngram_size is not None and no_repeat_ngram_size < 1:
            raise ValueError(f"no_repeat_ngram_size must be None or >= 1, got {no_repeat_ngram_size!r}")
        if length_penalty is not None and (
            isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty != length_penalty
        ):
            raise ValueError(f"length_penalty must be None or a number, got {length_penalty!r}")
        if early_stopping is not None and (not isinstance(early_stopping, (bool, str)) or early_stopping not in (True, False, "never")):
            raise ValueError(f'early_stopping must be None, True, False or "never", got {early_stopping!r}')

        tokens = self.tokenizer.encode(prompt, return_tensors="pt").to(self.device)
        if tokens.shape[1] + max_new_tokens > self.cfg.n_ctx:
            raise ValueError(
                f"the prompt ({tokens.shape[1]} tokens) plus max_new_tokens={max_new_tokens} is longer than the "
                f"model's n_ctx={self.cfg.n_ctx}; beam search keeps every beam's whole history, so shorten one of them"
            )
        beams = Beams(self.model, self.tokenizer, torch.zeros(1, device=tokens.device), tokens, kv_cache)
        if length_penalty is not None or early_stopping is not None:
            return self.length_normalised_beam_search(
                beams, num_return_sequences, num_beams, max_new_tokens, no_repeat_ngram_size,
                1.0 if length_penalty is None else length_penalty, False if early_stopping is None else early_stopping,
            )
        finished: list[tuple[float, str]] = []
        for _ in tqdm(range(max_new_tokens), desc="beam search", leave=False):
            raise NotImplementedError()
        raise NotImplementedError()


    def length_normalised_beam_search(
        self,
        beams: Beams,
        num_return_sequences: int,
        num_beams: int,
        max_new_tokens: int,
        no_repeat_ngram_size: int | None,
        length_penalty: float,
        early_stopping: bool | str,
    ) -> list[tuple[float, str]]:
        """Hugging Face's beam search from the one-beam prompt ``beams``: (length-normalised score, text) pairs, best first.

        Every step, each beam proposes its ``2 * num_beams`` best next tokens and the
        ``2 * num_beams`` best of all proposals are ranked. Those among the ``num_beams``
        best that end in EOS finish (``BeamHypotheses.add``); the ``num_beams`` best that
        did not end run on, so the search always keeps ``num_beams`` beams. At
        ``max_new_tokens`` the ``num_beams`` best proposals all finish. ``is_done`` ends the
        search early, as ``early_stopping`` says.
        """
        finished = BeamHypotheses(num_beams, length_penalty, early_stopping, max_new_tokens)
        eos = self.tokenizer.eos_token_id
        for step in tqdm(range(max_new_tokens), desc="beam search", leave=False):
            length = step + 1
            proposals = beams.generate(k=2 * num_beams, no_repeat_ngram_size=no_repeat_ngram_size)
            ranked = proposals.logprob_sums.topk(min(2 * num_beams, len(proposals))).indices
            ended = proposals.tokens[ranked, -1] == eos
            if length == max_new_tokens:
                ended[:] = True  # at the last step every proposal ends
            for rank, (index, end) in enumerate(zip(ranked.tolist(), ended.tolist())):
                if end and rank < num_beams:
                    finished.add(float(proposals.logprob_sums[index]), length, proposals.tokens[index])
            running = ranked[~ended][:num_beams]
            if len(running) == 0:
                break
            beams = proposals[running]
            if finished.is_done(float(beams.logprob_sums.max()), length):
                break
        if not finished.hypotheses:  # max_new_tokens == 0: the prompt itself
            return [(0.0, self.tokenizer.decode(beams.tokens[0]))]
        return [(score, self.tokenizer.decode(tokens)) for score, _, tokens in finished.hypotheses[:num_return_sequences]]


def check_sampling_args(
    d_vocab: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 0.0, frequency_penalty: float = 0.0
) -> None:
    """Raise a ValueError saying what is allowed when a decoding setting is out of range.

    The classic contract: 0 turns top-k and top-p off (``top_p=0.0`` is off here, unlike
    in parts 5 and 7, which follow Hugging Face's ``top_p=1.0``).
    """
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    if not isinstance(top_k, int) or not 0 <= top_k <= d_vocab:
        raise ValueError(f"top_k must be an integer in [0, d_vocab={d_vocab}] (0 turns it off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 <= top_p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1] (0 turns it off), got {top_p!r}")
    if top_k > 0 and top_p > 0:
        raise ValueError("set top_k or top_p, not both: the classic sampler applies one of them")
    if not isinstance(frequency_penalty, (int, float)):
        raise ValueError(f"frequency_penalty must be a number, got {frequency_penalty!r}")
