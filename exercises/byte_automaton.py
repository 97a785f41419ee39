# GENERATED from solutions/byte_automaton.py by `sampling-course make-exercises`.
# Given code: nothing to fill in here; it runs on the exercises of the other files.
# stub-checksum: a394e58f2704be57dfcd99e591f25cf7344d4ae4210386b1394af2d2dbc8c6cc
"""Part 8: structured generation. First, a regular expression as an automaton over bytes.

"Answer in JSON", "a date as YYYY-MM-DD", "one of these five labels": production engines
(vLLM's guided decoding, llama.cpp's grammars, outlines, xgrammar) guarantee such formats
by *constrained decoding*. At every step, the tokens that would break the format get a
logit of -inf, and the model samples from what is left:

    regular expression -> automaton over characters (parsed by the interegular library,
                          compiled and minimised in ``char_automaton.py``, written for you)
                       -> automaton over bytes (``ByteAutomaton``, this file, written for you)
                       -> token index: for each state, the tokens that may follow and
                          where each leads (``token_index.py``: ``walk_token``, ``build_index``;
                          ``fast_index.py``: the same index, every token walked at once)
                       -> per step: mask the logits of each row's state, sample, advance
                          each row's state (``token_constraint.py``, part 5's ``generate``)

Then a JSON-schema subset as a regular expression (``json_schema.py``), and what masking
does to the model's distribution, computed exactly (``distortion.py``).

Tokens are byte strings. GPT-2's vocabulary is byte-level: a token may hold half of a
multi-byte character ("é" is two bytes, and a token can end after the first), so the
automaton must read bytes, and a state may sit in the middle of a character.

Character classes are read as Python's ``re`` reads them with the ``re.ASCII`` flag:
``\\d`` is ``[0-9]``, ``\\w`` is ``[a-zA-Z0-9_]``, ``\\s`` is ``[ \\t\\n\\r\\f\\v]`` (and
``\\D``, ``\\W``, ``\\S`` their complements, non-ASCII characters included). Without the
flag, ``re`` would also count the other scripts' digits, letters and spaces.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from interegular.fsm import anything_else

# The automaton over characters and its minimisation; crawl_by_hash and hashed_crawl are read here by tests.
from .char_automaton import character_automaton, collector_paused, crawl_by_hash, hashed_crawl, minimise  # noqa: F401

# The code points a UTF-8 sequence of n bytes may encode (shorter encodings are invalid).
_UTF8_RANGES = {2: (0x80, 0x7FF), 3: (0x800, 0xFFFF), 4: (0x10000, 0x10FFFF)}
_SURROGATES = (0xD800, 0xDFFF)


def utf8_length(lead: int) -> int | None:
    """How many bytes the character that starts with byte ``lead`` has (None: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return None


def code_point_range(prefix: bytes) -> tuple[int, int] | None:
    """The code points whose UTF-8 encoding starts with ``prefix`` (1 to 4 bytes), as an interval.

    UTF-8 keeps the order of code points, so they form one interval [lo, hi]; None when no
    valid character starts so. Surrogates (U+D800-U+DFFF) inside the interval are not
    characters; ``valid_count`` leaves them out.
    """
    n = utf8_length(prefix[0])
    if n is None or len(prefix) > n or any(not 0x80 <= b <= 0xBF for b in prefix[1:]):
        return None
    value = prefix[0] & (0x7F, 0x1F, 0x0F, 0x07)[n - 1]
    for b in prefix[1:]:
        value = value << 6 | (b & 0x3F)
    missing_bits = 6 * (n - len(prefix))
    lo, hi = value << missing_bits, (value << missing_bits) | ((1 << missing_bits) - 1)
    if n > 1:
        lo, hi = max(lo, _UTF8_RANGES[n][0]), min(hi, _UTF8_RANGES[n][1])
    if lo > hi or valid_count(lo, hi) == 0:
        return None
    return lo, hi


def first_continuation(prefix: bytes) -> tuple[int, int]:
    """The bytes that may come right after ``prefix`` (an unfinished character), as a range.

    After the lead byte, four leads narrow it (no overlong encodings, no surrogates, nothing
    past U+10FFFF); every later continuation byte is 0x80-0xBF.
    """
    if len(prefix) == 1:
        return {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(prefix[0], (0x80, 0xBF))
    return 0x80, 0xBF


def valid_count(lo: int, hi: int) -> int:
    """How many characters (code points that are not surrogates) lie in [lo, hi]."""
    overlap = max(0, min(hi, _SURROGATES[1]) - max(lo, _SURROGATES[0]) + 1)
    return hi - lo + 1 - overlap


class ByteAutomaton:
    """A regular expression as a deterministic automaton over bytes.

    ``character_automaton`` (char_automaton.py) compiles the expression into an automaton over
    *characters*, over the alphabet interegular's parser gives it. This class reads UTF-8 bytes instead: an ASCII byte is a character of its own; the bytes of a
    multi-byte character are collected until the character is complete, and in between
    the automaton sits in a state "character state + pending bytes". Every state is
    *live*: ``step`` never enters a state from which no accepting state can be reached,
    so a text that reaches a state can always be completed into a member of the language.

    ``initial`` is the start state; ``step(state, byte)`` is the next state or None (the
    byte cannot come next); ``is_accepting(state)`` says whether the text read so far is a
    member. States are small integers, numbered as they are discovered.

    The expression is read as Python's ``re`` reads it with the ``re.ASCII`` flag (see the
    top of this file): a text reaches an accepting state exactly when
    ``re.fullmatch(pattern, text, re.ASCII)`` matches it.
    """

    def __init__(self, pattern: str):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a regular expression as a str, got {type(pattern).__name__}")
        with collector_paused():  # no garbage cycles are made here (see collector_paused)
            try:
                fsm = character_automaton(pattern)
            except Exception as exc:  # interegular's parser raises several kinds for unsupported syntax
                raise ValueError(f"cannot compile the regular expression {pattern!r}: {exc}") from None
            self.pattern = pattern
            self.compiled = fsm  # the automaton over characters, as its subset construction left it
            live = self._live_states(fsm)
            if fsm.initial not in live:
                raise ValueError(f"the regular expression {pattern!r} matches no text at all")
            # Equivalent states merged: the same language with fewer states, and every state live.
            self.fsm = fsm = minimise(fsm, live)
        self.live = set(fsm.states)
        self._symbol = fsm.alphabet  # character -> symbol (anything_else for unlisted characters)
        self._anything_else = fsm.alphabet[anything_else]
        # The characters interegular lists explicitly, as sorted code points with their symbols.
        listed = sorted((ord(c), s) for c, s in fsm.alphabet.items() if c is not anything_else)
        self._listed_points = [point for point, _ in listed]
        self._listed_symbols = [symbol for _, symbol in listed]
        self._ascii_symbols = [self._symbol[chr(b)] for b in range(0x80)]
        self._states: list[tuple[int, bytes]] = []  # number -> (character state, pending bytes)
        self._numbers: dict[tuple[int, bytes], int] = {}
        self._rows: list[list[int | None] | None] = []  # number -> next state for each of the 256 bytes
        self._live_moves: dict[int, set] = {}
        self._prefixes: dict[bytes, tuple | None] = {}
        self._continuation_lists: dict[bytes, list] = {}
        self.initial = self._number((fsm.initial, b""))

    @staticmethod
    def _live_states(fsm) -> set:
        """The character states from which an accepting state can be reached."""
        parents = defaultdict(set)
        for state, moves in fsm.map.items():
            for target in moves.values():
                parents[target].add(state)
        live, todo = set(fsm.finals), list(fsm.finals)
        while todo:
            for parent in parents[todo.pop()]:
                if parent not in live:
                    live.add(parent)
                    todo.append(parent)
        return live

    def _number(self, state: tuple[int, bytes], key=None) -> int:
        """The number of the state (character state, pending bytes); states with the same ``key`` share one."""
        key = state if key is None else key
        if key not in self._numbers:
            self._numbers[key] = len(self._states)
            self._states.append(state)
            self._rows.append(None)
        return self._numbers[key]

    @property
    def n_states(self) -> int:
        """States discovered so far (the automaton grows as texts are read)."""
        return len(self._states)

    def is_accepting(self, state: int) -> bool:
        char_state, pending = self._states[state]
        return not pending and char_state in self.fsm.finals

    def step(self, state: int, byte: int) -> int | None:
        return self.row(state)[byte]

    def row(self, state: int) -> list[int | None]:
        """The next state after each of the 256 bytes (None where the byte cannot come next)."""
        row = self._rows[state]
        if row is None:  # computed once per state, for all 256 bytes
            char_state, pending = self._states[state]
            row = [None] * 256
            if pending:  # only a continuation byte can come next
                # The bytes that complete a character move as its symbol does: looked up once per symbol.
                moves, seen = self.fsm.map[char_state], {}
                for b, longer, symbol in self._continuations(pending):
                    if symbol is None:
                        row[b] = self._next(char_state, longer)
                        continue
                    if symbol not in seen:
                        target = moves.get(symbol)
                        seen[symbol] = None if target is None or target not in self.live else self._number((target, b""))
                    row[b] = seen[symbol]
            else:  # an ASCII character, or the lead byte of a longer one (0xC2-0xF4)
                # ASCII bytes of one symbol (such as the 10 digits of [0-9]) move alike: looked up once.
                moves, seen = self.fsm.map[char_state], {}
                for b, symbol in enumerate(self._ascii_symbols):
                    if symbol not in seen:
                        target = moves.get(symbol)
                        seen[symbol] = None if target is None or target not in self.live else self._number((target, b""))
                    row[b] = seen[symbol]
                for b in range(0xC2, 0xF5):
                    row[b] = self._next(char_state, bytes([b]))
            self._rows[state] = row
        return row

    def _continuations(self, pending: bytes) -> list[tuple[int, bytes, object]]:
        """(byte, ``pending`` + byte, the symbol of the character they complete or None) for each byte that may
        come after ``pending``: the same for every state, so worked out once per ``pending``."""
        found = self._continuation_lists.get(pending)
        if found is None:
            low, high = first_continuation(pending)
            found = []
            for b in range(low, high + 1):
                longer = pending + bytes((b,))
                prefix = self._prefix(longer)
                found.append((b, longer, self._symbol[chr(prefix[0])] if prefix is not None and prefix[1] else None))
            self._continuation_lists[pending] = found
        return found

    def _char_step(self, char_state: int, char: str):
        target = self.fsm.map[char_state].get(self._symbol[char])
        return target if target in self.live else None

    def _moves(self, char_state: int) -> set:
        """The symbols that lead from ``char_state`` to a live state (computed once per state)."""
        if char_state not in self._live_moves:
            self._live_moves[char_state] = {s for s, target in self.fsm.map[char_state].items() if target in self.live}
        return self._live_moves[char_state]

    def _next(self, char_state: int, pending: bytes) -> int | None:
        prefix = self._prefix(pending)
        if prefix is None:
            return None
        lo, complete, symbols, unlisted, any_key = prefix
        if complete:
            target = self._char_step(char_state, chr(lo))
            return None if target is None else self._number((target, b""))
        # Part of a character: go on only if some character that starts so can be read here.
        # Characters interegular does not list all take the `anything_else` move.
        moves = self._moves(char_state)
        if symbols.isdisjoint(moves) and not (unlisted and self._anything_else in moves):
            return None
        if any_key is not None:
            return self._number((char_state, pending), (char_state, *any_key))
        return self._number((char_state, pending))

    def _prefix(self, pending: bytes) -> tuple | None:
        """What the moves from a state depend on in ``pending`` (cached: it is the same for every state).

        (lowest code point, whether the character is complete, the symbols of the listed
        characters that start so, whether some unlisted character starts so, and the key
        shared by equivalent prefixes or None). None when no character starts so.
        """
        if pending not in self._prefixes:
            span = code_point_range(pending)
            if span is None:
                self._prefixes[pending] = None
            else:
                lo, hi = span
                start, stop = bisect.bisect_left(self._listed_points, lo), bisect.bisect_right(self._listed_points, hi)
                to_go = utf8_length(pending[0]) - len(pending)
                # No listed character starts so: every completion takes the same move, so all
                # such prefixes with the same number of bytes to go (and the same range for the
                # next byte) are one state. Without this, a vocabulary of single bytes would
                # reach one state per prefix of every character: some 20,000 per character state.
                any_key = ("any", to_go, first_continuation(pending)) if start == stop else None
                symbols = set(self._listed_symbols[start:stop])
                self._prefixes[pending] = (lo, to_go == 0, symbols, valid_count(lo, hi) > stop - start, any_key)
        return self._prefixes[pending]
