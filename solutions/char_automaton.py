"""Part 8: a regular expression as a deterministic automaton over characters, with as few states as possible.

``ByteAutomaton`` (byte_automaton.py) reads UTF-8 bytes on top of the automaton built here:

* ``character_automaton``: the expression parsed by the interegular library, compiled by
  ``PositionAutomaton`` (Glushkov's position construction, then one subset construction), or by
  interegular itself for the constructs that does not cover (lookarounds, inline flags), through
  ``crawl_by_hash``;
* ``minimise``: equivalent states merged (Hopcroft's partition refinement).

Given code, written for you: nothing to fill in here.
"""

from __future__ import annotations

import contextlib
import gc
from collections import defaultdict

import interegular
import interegular.fsm
from interegular import patterns
from interegular.fsm import FSM, OblivionError


@contextlib.contextmanager
def collector_paused():
    """Within the block, Python's cyclic garbage collector does not run (as it was, afterwards).

    Building an automaton makes hundreds of thousands of small sets, dicts and tuples, none of
    them part of a reference cycle, and each few hundred of them set off a collection pass over
    every object of the process: with a 50,000-token vocabulary loaded, those passes were half
    of a JSON schema's compile time and found nothing to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def crawl_by_hash(alphabet, initial, final, follow):
    """interegular's ``crawl`` (the subset construction behind its ``+``, ``|``, ``*`` and ``{m,n}``), the same
    automaton state for state, with each new state found through a dict instead of a list.

    interegular looks every state it reaches up with ``list.index``: the time grows with the square
    of the number of states, and a JSON schema with strings of up to 20 characters spends most of its
    compile time there. Its states are frozensets, sets or dicts; the key says when two are equal.
    """
    states, numbers, finals, moves = [initial], {}, set(), {}

    def key(state):
        if isinstance(state, dict):
            return ("dict", frozenset(state.items()))
        return frozenset(state) if isinstance(state, (set, frozenset)) else state

    numbers[key(initial)] = 0
    for i, state in enumerate(states):  # the list grows while it is read
        if final(state):
            finals.add(i)
        moves[i] = {}
        for transition in alphabet.by_transition:
            try:
                target = follow(state, transition)
            except OblivionError:  # the dead state: interegular leaves it out
                continue
            j = numbers.setdefault(key(target), len(states))
            if j == len(states):
                states.append(target)
            moves[i][transition] = j
    return FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals, map=moves, __no_validation__=True)


@contextlib.contextmanager
def hashed_crawl():
    """Within the block, interegular's automata are built by ``crawl_by_hash`` (its FSM methods call the
    module's ``crawl``); outside it, interegular is left as it was."""
    saved, interegular.fsm.crawl = interegular.fsm.crawl, crawl_by_hash
    try:
        yield
    finally:
        interegular.fsm.crawl = saved


class _NotCovered(Exception):
    """A construct ``PositionAutomaton`` leaves to interegular: lookarounds and inline flags."""


class PositionAutomaton:
    """The automaton over characters of a parsed expression, by Glushkov's position construction and one
    subset construction, over interegular's alphabet and with its reading of every construct.

    interegular builds an automaton for every node of the expression and joins them with a subset
    construction per ``+``, ``|`` and repeat: a JSON schema with strings of up to 20 characters spends
    most of its compile time there. Here every character class of the expanded expression is a
    *position*; ``follow[p]`` holds the positions that may come right after ``p`` (position 0 is the
    start), and a state of the deterministic automaton is the set of positions the text read so far may
    end at. ``x{m,n}`` is m copies of ``x`` and then n - m nested optional ones, ``(x(x)?)?``, so that a
    state holds few positions. The language is interegular's (tests/course/test_minimise.py compares
    them); the states are numbered differently, which ``minimise`` makes irrelevant.
    """

    def __init__(self, parsed: patterns.Pattern):
        self.alphabet = parsed.get_alphabet(patterns.REFlags(0))  # what interegular's to_fsm() reads with
        self._symbols_of_dot = frozenset(self.alphabet[c] for c in self.alphabet if c != "\n")
        self.symbols: list[frozenset] = [frozenset()]  # position -> the symbols it reads (0: the start)
        self.follow: list[set] = [set()]
        nullable, first, last = self._build(parsed)
        self.follow[0] = set(first)
        self.accepting = frozenset(last | ({0} if nullable else set()))

    def _position(self, symbols) -> tuple[bool, set, set]:
        self.symbols.append(frozenset(symbols))
        self.follow.append(set())
        return False, {len(self.symbols) - 1}, {len(self.symbols) - 1}

    def _concatenate(self, one, other) -> tuple[bool, set, set]:
        for position in one[2]:
            self.follow[position] |= other[1]
        return (one[0] and other[0], one[1] | other[1] if one[0] else one[1], other[2] | one[2] if other[0] else other[2])

    def _build(self, node) -> tuple[bool, set, set]:
        """(whether ``node`` matches the empty text, its first positions, its last positions); follow filled in."""
        empty = (True, set(), set())
        if isinstance(node, patterns.Pattern):
            if node.added_flags or node.removed_flags:
                raise _NotCovered
            options = [self._build(option) for option in node.options]
            return (any(o[0] for o in options), set().union(*(o[1] for o in options)), set().union(*(o[2] for o in options)))
        if isinstance(node, patterns._Concatenation):
            result = empty
            for part in node.parts:
                if not isinstance(part, patterns._BasePattern):  # a lookahead or lookbehind
                    raise _NotCovered
                result = self._concatenate(result, self._build(part))
            return result
        if isinstance(node, patterns._Repeated):
            result = empty
            for _ in range(node.min):
                result = self._concatenate(result, self._build(node.base))
            if node.max is None:  # a star: the last positions lead back to the first
                nullable, first, last = self._build(node.base)
                for position in last:
                    self.follow[position] |= first
                return self._concatenate(result, (True, first, last))
            tail = empty
            for _ in range(node.max - node.min):
                _, first, last = self._concatenate(self._build(node.base), tail)
                tail = (True, first, last)
            return self._concatenate(result, tail)
        if isinstance(node, patterns._CharGroup):  # as _CharGroup.to_fsm reads it (without flags)
            chars = set(self.alphabet) - node.chars if node.negated else node.chars
            return self._position({self.alphabet[c] for c in chars})
        if node == patterns._DOT:
            return self._position(self._symbols_of_dot)
        if node == patterns._EMPTY:
            return empty
        raise _NotCovered

    def to_fsm(self) -> FSM:
        """The subset construction: states are sets of positions, numbered as they are found."""
        steps = []  # position -> {symbol: the positions that may follow it on that symbol}
        for follow in self.follow:
            by_symbol = defaultdict(set)
            for position in follow:
                for symbol in self.symbols[position]:
                    by_symbol[symbol].add(position)
            steps.append([(symbol, frozenset(targets)) for symbol, targets in by_symbol.items()])
        order, numbers, finals, moves = [frozenset([0])], {frozenset([0]): 0}, set(), {}
        for i, state in enumerate(order):  # the list grows while it is read
            if not self.accepting.isdisjoint(state):
                finals.add(i)
            targets = defaultdict(set)
            for position in state:
                for symbol, reached in steps[position]:
                    targets[symbol] |= reached
            row = moves[i] = {}
            for symbol, reached in targets.items():
                key = frozenset(reached)
                j = numbers.setdefault(key, len(order))
                if j == len(order):
                    order.append(key)
                row[symbol] = j
        return FSM(alphabet=self.alphabet, states=range(len(order)), initial=0, finals=finals, map=moves, __no_validation__=True)


def character_automaton(pattern: str) -> FSM:
    """The deterministic automaton over characters of ``pattern``: ``PositionAutomaton``'s, or interegular's own
    (through ``crawl_by_hash``) for what that does not cover."""
    parsed = interegular.parse_pattern(pattern)
    try:
        return PositionAutomaton(parsed).to_fsm()
    except _NotCovered:
        with hashed_crawl():
            return parsed.to_fsm()


def minimise(fsm: FSM, live: set) -> FSM:
    """The smallest automaton with the language of ``fsm``'s live states (Hopcroft's partition refinement).

    interegular's subset construction leaves equivalent states apart: a JSON schema's 1,337
    character states are 851 once merged, and every later stage (the byte states, the token
    walk, the index rows, the mask table) costs in proportion. Moves into a state that is not
    live go to an implicit dead state, which the result leaves out as interegular does. The
    states are numbered breadth-first from the initial one, moves taken in symbol order.
    """
    symbols = sorted(fsm.alphabet.by_transition)
    states = sorted(live)
    dead = -1
    # sources[symbol][target]: the states that move to target on symbol (the dead state collects the rest).
    sources = {symbol: defaultdict(list) for symbol in symbols}
    for state in [*states, dead]:
        moves = fsm.map.get(state, {}) if state != dead else {}
        for symbol in symbols:
            target = moves.get(symbol, dead)
            sources[symbol][target if target in live else dead].append(state)
    finals = {state for state in states if state in fsm.finals}
    blocks = [set(block) for block in (finals, set(states) - finals | {dead}) if block]  # copies: split in place
    block_of = {state: i for i, block in enumerate(blocks) for state in block}
    waiting = set(range(len(blocks)))
    while waiting:
        splitter = list(blocks[waiting.pop()])  # a copy: the block itself may be split below
        for symbol in symbols:
            by_target = sources[symbol]
            hit = defaultdict(set)  # block -> its states that move into the splitter on symbol
            for target in splitter:
                for source in by_target.get(target, ()):
                    hit[block_of[source]].add(source)
            for i, inside in hit.items():
                block = blocks[i]
                if len(inside) == len(block):
                    continue
                block -= inside  # block i keeps the states outside the splitter's preimage
                blocks.append(inside)
                new = len(blocks) - 1
                for state in inside:
                    block_of[state] = new
                # Hopcroft: if block i still waits, both halves must; otherwise the smaller half suffices.
                waiting.add(new if i in waiting or len(inside) <= len(block) else i)
    # Number the merged states breadth-first from the initial state.
    number, order = {block_of[fsm.initial]: 0}, [fsm.initial]
    new_map = {}
    for representative in order:
        row = {}
        for symbol in symbols:
            target = fsm.map[representative].get(symbol)
            if target is None or target not in live:
                continue
            b = block_of[target]
            if b not in number:
                number[b] = len(order)
                order.append(target)
            row[symbol] = number[b]
        new_map[number[block_of[representative]]] = row
    new_finals = {number[block_of[s]] for s in finals if block_of[s] in number}
    return FSM(alphabet=fsm.alphabet, states=range(len(order)), initial=0, finals=new_finals, map=new_map, __no_validation__=True)
