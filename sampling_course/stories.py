"""A story source whose probabilities are known exactly.

The "story" reference models are trained on short children's stories drawn from the
probabilistic grammar in this file. Because we wrote the grammar, we know the exact
probability of every story it can tell, and that gives us two things a real corpus never
does:

* an **entropy floor**: the average number of nats per token that *no* model can beat
  on these stories (see :func:`entropy_floor`), so a model's held-out loss says how far
  it is from perfect, not just that it went down;
* a **validity check** for generated text: does a sentence belong to the language at all
  (:func:`validity`), and how likely is a whole continuation under the true source
  (:func:`prefix_logprob`)? ``sampling_course.report.decoding_report`` turns these into
  a table that compares decoding methods.

How the grammar works
---------------------
A story is a sequence of sentences. Each sentence comes from a *table* of weighted
templates (all of them in ``sampling_course.story_tables``) such as ``"{He} looked {spot}."``. A slot in braces is either

* **bound**: its value was fixed earlier in the story (the hero's name ``{hero}``, the
  pronoun ``{He}``, the favourite toy ``{toy}``), so the sentence must repeat it; this
  is what ties the end of a story to its beginning; or
* **free**: a fresh choice from a word table (``{spot}`` is "under the bed", "behind
  the door", ...), which may then be bound for the rest of the paragraph or story.

The probability of a story is the product of every choice made: which template, which
free words, and how many middle episodes (after each episode the story goes on with
probability 3/4, so lengths range from six sentences to well over a thousand tokens).

Every story has exactly one derivation: at each step the parser (the same story code run
in reverse, see ``_Parser``) checks that *exactly one* template and filling of the table
reproduces the next sentence, and raises ``GrammarAmbiguity`` otherwise. So the
probability of a text is the probability of its one derivation, which
:func:`parse_story` recovers from the text alone.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Mapping

from sampling_course.story_tables import (
    AFTER_SNACK,
    ANSWER,
    ASK,
    BEDTIME,
    BYE,
    DREAM,
    DREAM_OF_VISIT,
    EAT,
    FOUND,
    HOME,
    LAST_LINE,
    LOOK,
    LOOK_AGAIN,
    LOST_FAMILY,
    MEET,
    NEXT_PART,
    OPENING,
    PET,
    PLAY,
    PRONOUNS,
    REUNION,
    SEARCH,
    SHARE,
    SLOT_DOMAINS,
    TABLES,
    THANKS,
    TOY,
    WEATHER,
    WHY,
    WORD_CHOICES,
    Choice,
    Table,
)

__all__ = [
    "EOS_TOKEN",
    "HELDOUT_SEED",
    "GrammarAmbiguity",
    "Story",
    "entropy_floor",
    "heldout_stories",
    "parse_story",
    "prefix_logprob",
    "sample_stories",
    "sentence_is_valid",
    "split_sentences",
    "validity",
    "whole_sentences",
]

EOS_TOKEN = "<|endoftext|>"

# Stories drawn with this seed are never used for training: they measure held-out loss,
# and the long-text experiment reads them.
HELDOUT_SEED = 31337

# ---------------------------------------------------------------------------------------
# The story, as code run by a teller (sampling) or by a parser (reading)
# ---------------------------------------------------------------------------------------


class GrammarAmbiguity(RuntimeError):
    """A sentence could be produced in more than one way: a bug in the grammar tables."""


class _NoParse(Exception):
    """The text is not something the grammar can produce."""


class _OutOfText(_NoParse):
    """The text ended (cleanly, between sentences) before the story did."""


@dataclass
class _Said:
    """What one step of the story chose: the template's tag and the free words."""

    tag: str
    fillers: dict[str, str]

    def __getitem__(self, slot: str) -> str:
        return self.fillers[slot]


class _Teller:
    """Draws each step at random and writes the text."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pieces: list[str] = []
        self.logprob = 0.0

    def say(self, table: Table, env: Mapping[str, str], paragraph: bool = False) -> _Said:
        i = table.choice.draw(self.rng)
        template = table.templates[i]
        self.logprob += table.choice.logp[i]
        fillers: dict[str, str] = {}
        out: list[str] = []
        for is_slot, text in template.parts:
            if not is_slot:
                out.append(text)
            elif text in env:
                out.append(env[text])
            elif text in fillers:  # a free slot used twice in one sentence repeats itself
                out.append(fillers[text])
            else:
                words = WORD_CHOICES[text]
                j = words.draw(self.rng)
                fillers[text] = words.values[j]
                self.logprob += words.logp[j]
                out.append(words.values[j])
        if self.pieces:
            self.pieces.append("\n\n" if paragraph else " ")
        self.pieces.append("".join(out))
        return _Said(template.tag, fillers)


# A sentence: optional whitespace, then text up to the first . ! or ?, and a closing quote.
_SENTENCE = re.compile(r'(\s*)([^.!?]*[.!?]"?)')


def _match(parts, i: int, sentence: str, pos: int, env: Mapping[str, str],
           domains: Callable[[str], Choice], fillers: dict[str, str], out: list) -> None:
    """Collect every way of filling ``parts[i:]`` so that it spells ``sentence[pos:]``."""
    if i == len(parts):
        if pos == len(sentence):
            out.append(dict(fillers))
        return
    is_slot, text = parts[i]
    if is_slot:
        fixed = env.get(text, fillers.get(text))
        if fixed is None:
            words = domains(text)
            for value in words.values:
                if sentence.startswith(value, pos):
                    fillers[text] = value
                    _match(parts, i + 1, sentence, pos + len(value), env, domains, fillers, out)
                    del fillers[text]
            return
        text = fixed
    if sentence.startswith(text, pos):
        _match(parts, i + 1, sentence, pos + len(text), env, domains, fillers, out)


def _word_choice(slot: str) -> Choice:
    return WORD_CHOICES[SLOT_DOMAINS.get(slot, slot)]


class _Parser:
    """Reads a text sentence by sentence, making the choice the text shows at each step."""

    def __init__(self, text: str):
        self.sentences: list[tuple[str, str]] = []
        pos = 0
        while (m := _SENTENCE.match(text, pos)) and m.end() > pos:
            self.sentences.append((m.group(1), m.group(2)))
            pos = m.end()
        self.rest = text[pos:]  # a trailing partial sentence, if any
        self.next = 0
        self.logprob = 0.0

    def say(self, table: Table, env: Mapping[str, str], paragraph: bool = False) -> _Said:
        if self.next == len(self.sentences):
            raise _OutOfText
        sep, sentence = self.sentences[self.next]
        if sep != ("" if self.next == 0 else "\n\n" if paragraph else " "):
            raise _NoParse
        found = []
        for i, template in enumerate(table.templates):
            ways: list[dict[str, str]] = []
            _match(template.parts, 0, sentence, 0, env, _word_choice, {}, ways)
            found.extend((i, fillers) for fillers in ways)
        if not found:
            raise _NoParse
        if len(found) > 1:
            raise GrammarAmbiguity(f"{sentence!r} matches {len(found)} ways in table {table.name!r}")
        i, fillers = found[0]
        self.logprob += table.choice.logp[i] + sum(
            _word_choice(slot).logp[_word_choice(slot).values.index(value)]
            for slot, value in fillers.items()
        )
        self.next += 1
        return _Said(table.templates[i].tag, fillers)


def _tell(t: _Teller | _Parser) -> None:
    """The story grammar. Sampling and parsing both run exactly this code."""
    opening = t.say(OPENING, {})
    kind = opening.tag
    env = dict(PRONOUNS[kind], hero=opening[f"{kind}_name"])
    for table in (HOME, PET, TOY):
        env.update(t.say(table, env).fillers)

    while True:
        part = t.say(NEXT_PART, env, paragraph=True)
        if part.tag == "end":
            break
        local = {**env, **part.fillers}
        _EPISODES[part.tag](t, env, local)

    t.say(BEDTIME, env)
    if "first_place" in env:
        t.say(DREAM_OF_VISIT, env)
    else:
        t.say(DREAM, env)
    t.say(LAST_LINE, env)


def _visit(t, env: dict, local: dict) -> None:
    local.update(t.say(MEET, local).fillers)
    if "first_place" not in env:  # remembered for the dream at the end of the story
        env["first_place"], env["first_animal"] = local["place"], local["animal"]
    question = t.say(ASK, local)
    t.say(ANSWER[question.tag], local)
    t.say(PLAY, local)
    t.say(BYE, local)


def _lost(t, env: dict, local: dict) -> None:
    t.say(LOOK, local)
    while t.say(LOOK_AGAIN, local).tag == "again":
        pass
    t.say(FOUND, local)


def _weather(kind: str):
    def episode(t, env: dict, local: dict) -> None:
        for table in WEATHER[kind]:
            t.say(table, local)

    return episode


def _help(t, env: dict, local: dict) -> None:
    t.say(WHY, local)
    local.update(t.say(LOST_FAMILY, local).fillers)
    t.say(SEARCH, local)
    t.say(REUNION, local)
    t.say(THANKS, local)


def _snack(t, env: dict, local: dict) -> None:
    t.say(EAT, local)
    t.say(SHARE, local)
    t.say(AFTER_SNACK, local)


_EPISODES = {
    "visit": _visit,
    "lost": _lost,
    "rain": _weather("rain"),
    "snow": _weather("snow"),
    "hot": _weather("hot"),
    "help": _help,
    "snack": _snack,
}

# ---------------------------------------------------------------------------------------
# Public API: sampling and scoring stories
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Story:
    """A story and its exact natural-log probability under the grammar."""

    text: str
    logprob: float


def sample_stories(n: int, seed: int) -> list[Story]:
    """Draw ``n`` stories; the same ``seed`` always gives the same stories."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    rng = random.Random(seed)
    stories = []
    for _ in range(n):
        teller = _Teller(rng)
        _tell(teller)
        stories.append(Story("".join(teller.pieces), teller.logprob))
    return stories


def parse_story(text: str) -> float | None:
    """The log-probability of a complete story, read from its text; None if impossible.

    The whole text must be one story, exactly as the grammar writes it (no trailing
    space, no ``<|endoftext|>``).
    """
    parser = _Parser(text)
    try:
        _tell(parser)
    except _NoParse:
        return None
    if parser.next != len(parser.sentences) or parser.rest:
        return None  # text left over after the story ended
    return parser.logprob


def prefix_logprob(text: str) -> tuple[float, bool] | None:
    """Log-probability that a story starts with the whole sentences of ``text``.

    A trailing partial sentence is ignored. Returns ``(logprob, complete)``, where
    ``complete`` says the sentences make a whole story (the source would stop there),
    or None when the sentences are not a possible start of a story.
    """
    parser = _Parser(text)
    try:
        _tell(parser)
    except _OutOfText:
        return parser.logprob, False
    except _NoParse:
        return None
    if parser.next != len(parser.sentences):
        return None  # more sentences after the story ended
    return parser.logprob, True


def entropy_floor(stories: Iterable[Story], tokenizer) -> float:
    """The source's entropy rate on these stories, in nats per token.

    ``sum(-logprob) / sum(tokens + 1)``: a model reads ``<|endoftext|>`` and then
    predicts each story token and the closing ``<|endoftext|>`` (the "+ 1"; where a story
    ends is one of the grammar's choices, so its probability is already in ``logprob``).
    No model's average loss on the same stories can be lower, up to sampling noise.
    ``tokenizer`` is any callable that returns an object with ``input_ids``.
    """
    nats = 0.0
    tokens = 0
    for story in stories:
        nats -= story.logprob
        tokens += len(tokenizer(story.text).input_ids) + 1
    if tokens == 0:
        raise ValueError("entropy_floor needs at least one story")
    return nats / tokens


def heldout_stories(tokenizer, n_ctx: int, n_tokens: int = 20_000, seed: int = HELDOUT_SEED) -> list[Story]:
    """Fresh stories that fit a model's context whole, about ``n_tokens`` tokens in all.

    A model reads ``<|endoftext|>``, the story and a closing ``<|endoftext|>``, so a story
    fits when it has at most ``n_ctx - 2`` tokens. Longer stories (a few percent) are
    skipped, and :func:`entropy_floor` is computed on the same stories, so that a model's
    held-out loss and the floor always count the same tokens. ``tokenizer`` is any callable
    that returns an object with ``input_ids``.
    """
    if not isinstance(n_ctx, int) or n_ctx < 3:
        raise ValueError(f"n_ctx must be an integer of at least 3 (two <|endoftext|> and a story), got {n_ctx!r}")
    if not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive integer, got {n_tokens!r}")
    rng = random.Random(seed)
    chosen: list[Story] = []
    total = 0
    drawn = 0
    while total < n_tokens:
        for story in sample_stories(64, rng.getrandbits(32)):
            length = len(tokenizer(story.text).input_ids)
            if length + 2 <= n_ctx and total < n_tokens:
                chosen.append(story)
                total += length + 1
        drawn += 64
        if not chosen and drawn >= 1024:  # the shortest stories have dozens of tokens: a tiny n_ctx fits none
            raise ValueError(f"none of {drawn} stories fits n_ctx={n_ctx}; a larger n_ctx is needed")
    return chosen


# ---------------------------------------------------------------------------------------
# Judging generated text
# ---------------------------------------------------------------------------------------


def split_sentences(text: str) -> list[str]:
    """The complete sentences of ``text``, without their surrounding whitespace.

    ``<|endoftext|>`` ends a sentence too; a trailing partial sentence is dropped.
    """
    out = []
    for piece in text.split(EOS_TOKEN):
        pos = 0
        while (m := _SENTENCE.match(piece, pos)) and m.end() > pos:
            out.append(m.group(2).strip())
            pos = m.end()
    return out


def whole_sentences(text: str) -> str:
    """``text`` up to the end of its last complete sentence (a trailing partial one dropped)."""
    return text[: len(text) - len(_Parser(text).rest)]


def _profile_domains(kind: str) -> Callable[[str], Choice]:
    names = WORD_CHOICES[f"{kind}_name"]
    return lambda slot: names if slot == "hero" else _word_choice(slot)


@lru_cache(maxsize=100_000)
def sentence_is_valid(sentence: str) -> bool:
    """Could the grammar write this sentence, somewhere in some story?

    Context-free at the sentence level: every slot may hold any value of its table,
    except that the pronouns and the hero's name agree with one kind of hero (so "They
    was" and "Tom ... her pillow" are rejected). Whether the name is the right one for
    *this* story, or the sentence fits where it stands, is not checked.
    """
    for kind, pronouns in PRONOUNS.items():
        domains = _profile_domains(kind)
        for table in TABLES.values():
            for template in table.templates:
                ways: list = []
                _match(template.parts, 0, sentence, 0, pronouns, domains, {}, ways)
                if ways:
                    return True
    return False


def validity(text: str) -> float:
    """The fraction of complete sentences in ``text`` that the grammar can write.

    Each sentence is judged on its own (see :func:`sentence_is_valid`); a trailing
    partial sentence is ignored. Returns nan when there is no complete sentence.
    """
    sentences = split_sentences(text)
    if not sentences:
        return math.nan
    return sum(map(sentence_is_valid, sentences)) / len(sentences)
