"""The decoding report: what a decoding method's continuations look like next to the story source.

The story grammar (``sampling_course.stories``) knows every sentence it can write and the
exact probability of every story, so generated text can be measured against the truth:
how many of its sentences are possible at all, how much it repeats itself or the other
continuations, and how likely the source finds it. :func:`decoding_report` measures one
set of continuations; :func:`report_table` shows several decoding methods side by side::

    from sampling_course.report import decoding_report, report_table

    reports = {"greedy": decoding_report(greedy_texts, prompt=prompt),
               "top-p 0.9": decoding_report(top_p_texts, prompt=prompt)}
    console.print(report_table(reports))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from sampling_course.stories import EOS_TOKEN, prefix_logprob, sentence_is_valid, split_sentences, whole_sentences

__all__ = ["DecodingReport", "decoding_report", "report_table", "words"]

_WORD = re.compile(r"[\w']+|[^\w\s]")


def words(text: str) -> list[str]:
    """Words and punctuation marks, as the repetition metrics count them."""
    return _WORD.findall(text.replace(EOS_TOKEN, " "))


def _ngrams(seq: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


@dataclass(frozen=True)
class DecodingReport:
    """How a set of continuations looks, measured against the story source.

    * ``valid``: fraction of complete sentences the grammar can write (pooled).
    * ``distinct_2`` / ``distinct_3``: distinct word n-grams / all word n-grams, pooled
      over the continuations (low = the texts repeat each other or themselves).
    * ``repeated_4grams``: fraction of word 4-grams that already occurred earlier in the
      same continuation (high = loops).
    * ``logprob_per_token``: mean over the continuations that are a possible story
      (prompt included) of the source's log-probability of the continuation's whole
      sentences per token; nan when none is. Higher means closer to the source's own
      stories; the source's own value is about ``-entropy_floor``.
    * ``parsed``: the fraction of continuations for which that was defined.
    * ``mean_tokens``: mean continuation length in tokens.

    Each continuation ends at its first ``<|endoftext|>``, if any.
    """

    n: int
    valid: float
    distinct_2: float
    distinct_3: float
    repeated_4grams: float
    logprob_per_token: float
    parsed: float
    mean_tokens: float


def _distinct(seqs: list[list[str]], n: int) -> float:
    grams = [g for seq in seqs for g in _ngrams(seq, n)]
    return len(set(grams)) / len(grams) if grams else math.nan


def _repeated(seqs: list[list[str]], n: int) -> float:
    repeats = total = 0
    for seq in seqs:
        grams = _ngrams(seq, n)
        repeats += len(grams) - len(set(grams))
        total += len(grams)
    return repeats / total if total else math.nan


def _continuation_logprob(prompt: str, text: str, n_tokens: Callable[[str], int]) -> float | None:
    """Source log-probability per token of the whole sentences ``text`` adds to ``prompt``."""
    full = (prompt + text).split(EOS_TOKEN)[0]
    ended = EOS_TOKEN in prompt + text
    scored = prefix_logprob(full)
    before = prefix_logprob(prompt)
    if scored is None or before is None or (ended and not scored[1]):
        return None
    lp, complete = scored
    # Keep only whole sentences: drop a trailing partial one before counting tokens.
    tokens = n_tokens(whole_sentences(full)) - n_tokens(whole_sentences(prompt)) + (1 if complete else 0)
    if tokens <= 0:
        return None
    return (lp - before[0]) / tokens


def decoding_report(texts: Sequence[str], prompt: str = "", tokenizer=None) -> DecodingReport:
    """Measure continuations ``texts`` of ``prompt`` (each text excludes the prompt).

    Anything after a continuation's first ``<|endoftext|>`` (such as the padding of a
    batched generation) is ignored.

    ``tokenizer`` counts tokens; the story tokenizer by default.
    """
    if tokenizer is None:
        from sampling_course.tokenizer import load_story_tokenizer

        tokenizer = load_story_tokenizer()

    def n_tokens(s: str) -> int:
        return len(tokenizer(s).input_ids)

    texts = list(texts)
    # A story ends at <|endoftext|>; what a generator adds after it (padding) is not text.
    stories = [t.split(EOS_TOKEN)[0] for t in texts]
    n_valid = n_sentences = 0
    prompt_sentences = len(split_sentences(prompt))
    for text in stories:
        # Sentences that end inside the continuation (the first may have begun in the prompt).
        sentences = split_sentences(prompt + text)[prompt_sentences:]
        n_valid += sum(map(sentence_is_valid, sentences))
        n_sentences += len(sentences)
    seqs = [words(t) for t in stories]
    scores = [_continuation_logprob(prompt, t, n_tokens) for t in texts]
    scored = [s for s in scores if s is not None]
    return DecodingReport(
        n=len(texts),
        valid=n_valid / n_sentences if n_sentences else math.nan,
        distinct_2=_distinct(seqs, 2),
        distinct_3=_distinct(seqs, 3),
        repeated_4grams=_repeated(seqs, 4),
        logprob_per_token=sum(scored) / len(scored) if scored else math.nan,
        parsed=len(scored) / len(texts) if texts else math.nan,
        mean_tokens=sum(n_tokens(t) for t in stories) / len(texts) if texts else math.nan,
    )


def report_table(reports: Mapping[str, DecodingReport], title: str = "Decoding report"):
    """A rich Table with one row per decoding method."""
    from rich.table import Table as RichTable

    table = RichTable(title=title)
    table.add_column("method")
    for column in ("valid", "distinct-2", "distinct-3", "repeated 4-grams", "logprob/token", "parsed", "tokens"):
        table.add_column(column, justify="right")
    for name, r in reports.items():
        table.add_row(
            name,
            f"{r.valid:.0%}",
            f"{r.distinct_2:.2f}",
            f"{r.distinct_3:.2f}",
            f"{r.repeated_4grams:.0%}",
            f"{r.logprob_per_token:.3f}",
            f"{r.parsed:.0%}",
            f"{r.mean_tokens:.0f}",
        )
    return table
