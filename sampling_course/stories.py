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
  (:func:`prefix_logprob`)? :func:`decoding_report` turns these into a table that compares
  decoding methods.

How the grammar works
---------------------
A story is a sequence of sentences. Each sentence comes from a *table* of weighted
templates such as ``"{He} looked {spot}."``. A slot in braces is either

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

import bisect
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import Callable, Iterable, Mapping, Sequence

__all__ = [
    "Story",
    "GrammarAmbiguity",
    "sample_stories",
    "parse_story",
    "prefix_logprob",
    "entropy_floor",
    "heldout_stories",
    "story_loss",
    "HELDOUT_SEED",
    "validity",
    "sentence_is_valid",
    "split_sentences",
    "DecodingReport",
    "decoding_report",
    "report_table",
    "CONTINUE_PROBABILITY",
]

EOS_TOKEN = "<|endoftext|>"

# ---------------------------------------------------------------------------------------
# The grammar, as data
# ---------------------------------------------------------------------------------------

# Free slots draw from these word tables (uniformly unless a weight is given).
WORDS: dict[str, list[str | tuple[str, float]]] = {
    "girl_name": ["Mia", "Lily", "Anna", "Rose", "Emma", "Lucy", "Ella", "Ruby", "Zoe", "Nora", "Ivy", "Maya"],
    "boy_name": ["Tom", "Ben", "Max", "Leo", "Jack", "Noah", "Finn", "Oscar", "Sam", "Hugo", "Eli", "Owen"],
    "child_name": ["Alex", "Robin", "Kim", "Jo", "Sky", "Charlie", "Riley", "Morgan"],
    "home": [
        "little house by the sea",
        "small house near the woods",
        "big farm on the hill",
        "tiny cottage by the river",
        "yellow house in the town",
        "red house at the end of the road",
        "white house on a quiet street",
        "green house behind the school",
    ],
    "pet_kind": ["dog", "cat", "puppy", "kitten", "rabbit", "pony", "hamster", "lamb", "goose", "parrot"],
    "pet": ["Spot", "Fluffy", "Pip", "Buddy", "Coco", "Pepper", "Sunny", "Biscuit", "Patch", "Bubbles", "Ziggy", "Rosie"],
    "color": ["red", "blue", "green", "yellow", "pink", "purple", "white", "black", "brown", "silver"],
    "toy": [
        "ball", "kite", "drum", "boat", "teddy bear", "toy train", "hat", "book",
        "robot", "doll", "puzzle", "rocket", "wagon",
    ],
    "when": [
        "One day", "The next day", "One morning", "Later", "After that", "One afternoon",
        "Early one morning", "Soon",
    ],
    "place": ["park", "pond", "woods", "beach", "farm", "garden", "hill", "river", "meadow", "lake", "zoo"],
    "animal": [
        "duck", "fox", "frog", "bear", "goat", "mouse", "squirrel", "crab",
        "hedgehog", "turtle", "deer", "beaver", "mole", "badger",
    ],
    "game": ["hide and seek", "tag", "catch", "a funny game", "pirates"],
    "until": [
        "the sun went down",
        "it was time for lunch",
        "it got dark",
        "it started to rain",
        "they were very tired",
        "the stars came out",
    ],
    "spot": [
        "under the bed",
        "behind the door",
        "in the garden",
        "under the table",
        "in the toy box",
        "behind the sofa",
        "in the kitchen",
        "under the stairs",
    ],
    "family": ["mother", "father", "brother", "sister", "grandmother", "grandfather"],
    "found_at": ["by the big tree", "near the pond", "behind a rock", "under a bush", "next to the fence", "in the tall grass"],
    "food": [
        "an apple", "a banana", "some bread", "a big cookie", "some soup", "a piece of cake",
        "a pear", "some grapes", "a carrot", "some cheese",
    ],
    "indoor": ["read a book", "drew pictures", "built a tower of blocks", "sang songs", "played a board game", "baked a cake"],
    "water": ["lake", "river", "sea", "pool"],
    "dream": [
        "flying over the sea", "a big cake", "the moon and the stars", "a castle in the clouds",
        "a ship on the ocean", "a garden full of flowers",
    ],
}

# Bound slots that hold a value drawn from another table: in a sentence read on its own
# (see `validity`) they range over that table.
SLOT_DOMAINS = {"first_place": "place", "first_animal": "animal"}

# Pronoun slots are named after the "he" forms: {He} looked, gave it to {him}, {his} toy.
PRONOUNS: dict[str, dict[str, str]] = {
    "girl": {"He": "She", "he": "she", "him": "her", "his": "her", "His": "Her", "was": "was"},
    "boy": {"He": "He", "he": "he", "him": "him", "his": "his", "His": "His", "was": "was"},
    "child": {"He": "They", "he": "they", "him": "them", "his": "their", "His": "Their", "was": "were"},
}

# After each episode the story goes on with this probability, so the number of episodes
# is geometric: mean 3, but one story in a hundred or so has more than 15.
CONTINUE_PROBABILITY = 0.75

_SLOT = re.compile(r"\{(\w+)\}")
_TERMINAL = re.compile(r'[.!?]"?$')


@dataclass(frozen=True)
class _Choice:
    """A weighted table of alternatives (templates or words), ready to sample and score."""

    values: tuple
    weights: tuple[float, ...]
    cum: tuple[float, ...] = field(init=False)
    logp: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.values) != len(self.weights) or not self.values:
            raise ValueError("a choice needs one positive weight per value")
        if any(w <= 0 for w in self.weights):
            raise ValueError(f"weights must be positive: {self.weights}")
        total = math.fsum(self.weights)
        object.__setattr__(self, "cum", tuple(accumulate(self.weights)))
        object.__setattr__(self, "logp", tuple(math.log(w / total) for w in self.weights))

    def draw(self, rng: random.Random) -> int:
        return bisect.bisect_right(self.cum, rng.random() * self.cum[-1])


def _words(entries: list[str | tuple[str, float]]) -> _Choice:
    pairs = [(e, 1.0) if isinstance(e, str) else e for e in entries]
    if len({v for v, _ in pairs}) != len(pairs):
        raise ValueError(f"a word table lists the same word twice: {entries}")
    return _Choice(tuple(v for v, _ in pairs), tuple(w for _, w in pairs))


WORD_CHOICES: dict[str, _Choice] = {name: _words(entries) for name, entries in WORDS.items()}


@dataclass(frozen=True)
class Template:
    """One sentence pattern: literal text with ``{slot}`` holes, a weight and a tag.

    The tag tells the story code what was chosen (which kind of hero, which episode).
    """

    text: str
    weight: float = 1.0
    tag: str = ""
    parts: tuple[tuple[bool, str], ...] = field(init=False, repr=False)  # (is_slot, text)

    def __post_init__(self) -> None:
        parts: list[tuple[bool, str]] = []
        pos = 0
        for m in _SLOT.finditer(self.text):
            if m.start() > pos:
                parts.append((False, self.text[pos : m.start()]))
            parts.append((True, m.group(1)))
            pos = m.end()
        if pos < len(self.text):
            parts.append((False, self.text[pos:]))
        # A sentence ends with . ! or ? (perhaps inside a closing quote) and nowhere
        # else, so that splitting a text into sentences is unambiguous.
        if not _TERMINAL.search(self.text) or re.search(r"[.!?]", _TERMINAL.sub("", self.text)):
            raise ValueError(f"template must end, and only end, with . ! or ?: {self.text!r}")
        object.__setattr__(self, "parts", tuple(parts))

    @property
    def slots(self) -> list[str]:
        return [text for is_slot, text in self.parts if is_slot]


class Table:
    """A named, weighted table of sentence templates: one step of a story."""

    def __init__(self, name: str, templates: Sequence[Template]):
        self.name = name
        self.templates = tuple(templates)
        self.choice = _Choice(self.templates, tuple(t.weight for t in self.templates))

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {len(self.templates)} templates)"


TABLES: dict[str, Table] = {}


def _table(name: str, *templates: Template | str) -> Table:
    table = Table(name, [t if isinstance(t, Template) else Template(t) for t in templates])
    TABLES[name] = table
    return table


T = Template  # short alias for the tables below

# --- the opening: who, where, with whom, and the favourite toy --------------------------
OPENING = _table(
    "opening",
    T("Once upon a time, there was a little girl named {girl_name}.", 0.25, "girl"),
    T("There once was a girl called {girl_name}.", 0.2, "girl"),
    T("Once upon a time, there was a little boy named {boy_name}.", 0.25, "boy"),
    T("There once was a boy called {boy_name}.", 0.2, "boy"),
    T("Once upon a time, there was a child named {child_name}.", 0.1, "child"),
)
HOME = _table("home", "{He} lived in a {home}.", "{He} lived with {his} family in a {home}.")
PET = _table("pet", "{hero} had a {pet_kind} named {pet}.", "{hero} had a little {pet_kind} called {pet}.")
TOY = _table(
    "toy",
    "{His} favorite toy was a {color} {toy}.",
    "{hero} loved {his} {color} {toy} very much.",
)

# --- what comes after the opening or an episode: another episode, or the ending --------
_GO_ON = CONTINUE_PROBABILITY
NEXT_PART = _table(
    "next part",
    T("{when}, {hero} and {pet} went to the {place}.", _GO_ON * 0.3, "visit"),
    T("{when}, {hero} could not find {his} {color} {toy}.", _GO_ON * 0.2, "lost"),
    T("{when}, it was raining.", _GO_ON * 0.2 / 3, "rain"),
    T("{when}, it was snowing.", _GO_ON * 0.2 / 3, "snow"),
    T("{when}, the sun was very hot.", _GO_ON * 0.2 / 3, "hot"),
    T("{when}, {hero} saw a little {animal} who was crying.", _GO_ON * 0.15, "help"),
    T("{when}, {hero} felt hungry.", _GO_ON * 0.15, "snack"),
    T("That night, {hero} went to bed.", (1 - _GO_ON) * 0.5, "end"),
    T("In the evening, {hero} and {pet} went back to the {home}.", (1 - _GO_ON) * 0.5, "end"),
)

# --- episode: a visit, where the hero meets an animal ----------------------------------
MEET = _table("meet", "There they met a {animal}.", "There they saw a {animal}.")
ASK = _table(
    "ask",
    T('The {animal} asked, "Do you want to play?"', 1, "play"),
    T('The {animal} asked, "Will you be my friend?"', 1, "friend"),
    T('The {animal} asked, "What is your name?"', 1, "name"),
)
ANSWER = {
    "play": _table("answer play", '{hero} said, "Yes, let us play!"', '{hero} said, "I would love to!"'),
    "friend": _table("answer friend", '{hero} said, "Yes, I will be your friend!"', '{hero} smiled and said, "Of course!"'),
    "name": _table("answer name", '{hero} said, "My name is {hero}."', '{hero} said, "I am {hero}, and this is {pet}."'),
}
PLAY = _table(
    "play",
    "They played {game} until {until}.",
    "They played with the {color} {toy} until {until}.",
)
BYE = _table("bye", "Then {hero} waved goodbye to the {animal}.", "The {animal} went home, and so did they.")

# --- episode: the favourite toy is lost and found ---------------------------------------
LOOK = _table("look", "{He} looked {spot}.")
LOOK_AGAIN = _table(
    "look again",
    T("{He} also looked {spot}.", 0.4, "again"),
    T("At last, {pet} found it {spot}.", 0.6, "found"),
)
FOUND = _table(
    "found",
    '{hero} hugged {pet} and said, "Thank you, {pet}!"',
    "{He} {was} so happy to have {his} {toy} back.",
)

# --- episode: the weather ---------------------------------------------------------------
WEATHER = {
    "rain": [
        _table("rain", "{hero} and {pet} stayed inside and {indoor}.", "{hero} and {pet} played inside all day."),
        _table("rain after", "They listened to the rain on the roof.", "Soon the rain stopped."),
    ],
    "snow": [
        _table("snow", "{hero} and {pet} built a big snowman.", "{hero} and {pet} made a snowman in the garden."),
        _table("snow after", "{hero} put {his} {color} {toy} on the snowman.", "The snowman had a carrot for a nose."),
    ],
    "hot": [
        _table("hot", "{hero} and {pet} went to swim in the {water}.", "{hero} and {pet} sat in the shade of a tree."),
        _table("hot after", "It was nice and cool there.", "{hero} drank some cold water."),
    ],
}

# --- episode: helping a lost animal -----------------------------------------------------
WHY = _table("why", '{hero} asked, "Why are you sad, little {animal}?"', '{hero} asked, "What is wrong?"')
LOST_FAMILY = _table("lost family", 'The {animal} said, "I cannot find my {family}."')
SEARCH = _table(
    "search",
    "{hero} and {pet} helped the {animal} look for its {family}.",
    "So they all looked for the {animal}'s {family}.",
)
REUNION = _table("reunion", "Soon they found the {family} {found_at}.")
THANKS = _table("thanks", 'The little {animal} said, "Thank you, {hero}!"', "The {animal} was very happy.")

# --- episode: a snack -------------------------------------------------------------------
EAT = _table("eat", "{He} ate {food}.", "{He} had {food}.")
SHARE = _table("share", "{pet} ate some too.", "{He} gave a little bit to {pet}.")
AFTER_SNACK = _table("after snack", "Then they took a nap.", "Then they went outside to play.")

# --- the ending: ties back to the toy, the home and the first animal met ----------------
BEDTIME = _table(
    "bedtime",
    "{He} put {his} {color} {toy} next to {his} pillow.",
    "{He} held {his} {color} {toy} close.",
)
DREAM_OF_VISIT = _table(
    "dream of visit",
    "{He} dreamed about the {first_animal} at the {first_place}.",
    "{He} dreamed about the {first_place}.",
)
DREAM = _table("dream", "{He} dreamed about {dream}.")
LAST_LINE = _table(
    "last line",
    "The end.",
    "{hero} and {pet} were the best of friends.",
    "It had been a good day in the {home}.",
)

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
           domains: Callable[[str], _Choice], fillers: dict[str, str], out: list) -> None:
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


def _word_choice(slot: str) -> _Choice:
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


# ---------------------------------------------------------------------------------------
# Held-out loss of a model against the floor
# ---------------------------------------------------------------------------------------

# Stories drawn with this seed are never used for training: they measure held-out loss.
HELDOUT_SEED = 31337


def heldout_stories(tokenizer, n_ctx: int, n_tokens: int = 20_000, seed: int = HELDOUT_SEED) -> list[Story]:
    """Fresh stories that fit a model's context whole, about ``n_tokens`` tokens in all.

    A model reads ``<|endoftext|>``, the story and a closing ``<|endoftext|>``, so a story
    fits when it has at most ``n_ctx - 2`` tokens. Longer stories (a few percent) are
    skipped, and the entropy floor is computed on the same stories, so that loss and
    floor always count the same tokens.
    """
    rng = random.Random(seed)
    chosen: list[Story] = []
    total = 0
    while total < n_tokens:
        for story in sample_stories(64, rng.getrandbits(32)):
            length = len(tokenizer(story.text).input_ids)
            if length + 2 <= n_ctx and total < n_tokens:
                chosen.append(story)
                total += length + 1
    return chosen


def story_loss(hf_model, tokenizer, stories: Sequence[Story], batch_size: int = 16) -> float:
    """A causal LM's mean loss in nats per token on ``stories``, each read from position 0.

    Each story is read as ``<|endoftext|>`` + story, and the model is scored on every
    story token and the closing ``<|endoftext|>``: the tokens :func:`entropy_floor` counts.
    """
    import torch

    eos = tokenizer.eos_token_id
    rows = sorted(([eos] + tokenizer(s.text).input_ids + [eos] for s in stories), key=len)
    device = next(hf_model.parameters()).device
    nats = 0.0
    count = 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = len(batch[-1])
            # Right padding needs no attention mask in a causal model: real tokens never
            # look at the padding after them, and padded targets are masked out below.
            ids = torch.tensor([r + [eos] * (width - len(r)) for r in batch], device=device)
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch], device=device)
            logits = hf_model(ids).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            keep = mask[:, 1:].bool()
            nats -= logp[keep].sum().item()
            count += int(keep.sum())
    return nats / count


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


def _profile_domains(kind: str) -> Callable[[str], _Choice]:
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
    kept = full[: len(full) - len(_Parser(full).rest)]
    kept_prompt = prompt[: len(prompt) - len(_Parser(prompt).rest)]
    tokens = n_tokens(kept) - n_tokens(kept_prompt) + (1 if complete else 0)
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
