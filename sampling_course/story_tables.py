"""The story grammar's tables: the words a free slot draws from and the sentences of each step.

This file is the grammar as data; ``sampling_course.stories`` holds the code that tells a
story from these tables (sampling) and reads one back (parsing), and explains how the
grammar works. Each table is a weighted list of sentence templates such as
``"{He} looked {spot}."``; a slot in braces is filled either with a value fixed earlier in
the story (``{hero}``, ``{He}``, ``{toy}``) or with a fresh word from ``WORDS``.

Changing a table changes the stories, so the story tokenizer and the story models must
be rebuilt afterwards (``scripts/build_tokenizer.py --story``, then
``scripts/train_story_models.py``).
"""

from __future__ import annotations

import bisect
import math
import random
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Sequence

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
class Choice:
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


def _words(entries: list[str | tuple[str, float]]) -> Choice:
    pairs = [(e, 1.0) if isinstance(e, str) else e for e in entries]
    if len({v for v, _ in pairs}) != len(pairs):
        raise ValueError(f"a word table lists the same word twice: {entries}")
    return Choice(tuple(v for v, _ in pairs), tuple(w for _, w in pairs))


WORD_CHOICES: dict[str, Choice] = {name: _words(entries) for name, entries in WORDS.items()}


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
        self.choice = Choice(self.templates, tuple(t.weight for t in self.templates))

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
