"""Part 8's given byte automaton merges equivalent character states (``minimise``, Hopcroft's partition
refinement) before anything reads it. Given code, the same in solutions/ and exercises/, so tested here once:
the merged automaton (and the automaton over characters before merging, char_automaton.py's) accepts exactly
the texts interegular's own automaton and Python's ``re`` accept, no two of its states are equivalent, and the
count is the known minimum on textbook cases."""

import itertools
import random
import re

import pytest
from interegular import parse_pattern
from interegular.fsm import FSM, anything_else

from solutions import byte_automaton

# The expressions of the crawl test and part 8's tests: concatenations, unions, stars, counted repeats,
# classes with escapes, characters of several bytes, and a JSON string with escapes.
PATTERNS = [r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", r"[a-z0-9._]{1,3}@[a-z]{1,2}\.(com|org)",
            r'\{"n": "[^"\\]{0,3}", "k": -?[1-9]\d?\}', r" (café|cat|the) (big|é)+€?", r"(ab|c)*d", r"a[bc]*é?",
            r"(a|b)*abb(a|b){0,3}", r"(x|y|xy)*z{2,4}|q", r"(a|ab)(c|bcd)(d*)", r"(aa|aaa)*", r"\d+(\.\d+)?|-\d{1,3}",
            r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-f]{2}){0,3}"']


def characters(pattern: str) -> list[str]:
    """The characters the expression names, and two it does not (one ASCII, one not): every move is tried."""
    named = {c for c in parse_pattern(pattern).to_fsm().alphabet if c is not anything_else}
    return sorted(named | {"#", "ü"})


def texts(alphabet: list[str], longest: int):
    for n in range(longest + 1):
        yield from ("".join(chars) for chars in itertools.product(alphabet, repeat=n))


def accepts(fsm: FSM, text: str) -> bool:
    state = fsm.initial
    for char in text:
        symbol = fsm.alphabet[char] if char in fsm.alphabet else fsm.alphabet[anything_else]
        state = fsm.map.get(state, {}).get(symbol)
        if state is None:
            return False
    return state in fsm.finals


def interegular_automaton(pattern: str) -> FSM:
    """interegular's own automaton of the expression (its construction, not the course's)."""
    return parse_pattern(pattern).to_fsm()


def first_difference(one: FSM, other: FSM, alphabet: list[str], longest: int) -> str | None:
    """The shortest text (within ``longest`` characters of ``alphabet``) that one accepts and the other does not."""
    return next((text for text in texts(alphabet, longest) if accepts(one, text) != accepts(other, text)), None)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_minimised_automaton_accepts_what_interegular_and_re_accept(pattern):
    automaton = byte_automaton.ByteAutomaton(pattern)
    alphabet = characters(pattern)
    longest = 1
    while len(alphabet) ** (longest + 1) <= 5_000:  # every text up to the longest length that keeps it some 5,000
        longest += 1
    reference = interegular_automaton(pattern)
    for what, fsm in (("minimised", automaton.fsm), ("compiled", automaton.compiled)):
        text = first_difference(fsm, reference, alphabet, longest)
        assert text is None, f"{pattern}: {text!r} is accepted by one of the {what} automaton and interegular's only"
    for text in texts(alphabet, longest):
        assert accepts(automaton.fsm, text) == bool(re.fullmatch(pattern, text, re.ASCII)), f"{pattern}: {text!r}"
    # Longer members (random walks through interegular's automaton), read byte by byte through the byte automaton.
    for member in random_members(reference, 200):
        state = automaton.initial
        for byte in member.encode():
            state = automaton.step(state, byte)
            assert state is not None, f"{pattern}: the byte automaton refuses the member {member!r}"
        assert automaton.is_accepting(state), f"{pattern}: the byte automaton does not accept {member!r}"


def random_members(fsm: FSM, count: int, seed: int = 0) -> list[str]:
    """Texts the automaton accepts, by seeded random walks that stop in an accepting state a fifth of the time."""
    rng = random.Random(seed)
    live = byte_automaton.ByteAutomaton._live_states(fsm)
    chars_of = {}
    for char, symbol in fsm.alphabet.items():
        chars_of.setdefault(symbol, []).append(next(c for c in "ü#~Ω" if c not in fsm.alphabet) if char is anything_else else char)
    members = []
    while len(members) < count:
        state, text = fsm.initial, ""
        while len(text) < 60 and not (state in fsm.finals and rng.random() < 0.2):
            moves = [(symbol, target) for symbol, target in fsm.map[state].items() if target in live]
            if not moves:
                break
            symbol, state = rng.choice(moves)
            text += rng.choice(chars_of[symbol])
        if state in fsm.finals:
            members.append(text)
    return members


def distinguishable(fsm: FSM, one: int, other: int) -> bool:
    """Whether some text leads one of the two states to acceptance and the other not (a search of state pairs)."""
    dead = None
    seen, todo = {(one, other)}, [(one, other)]
    symbols = list(fsm.alphabet.by_transition)
    while todo:
        p, q = todo.pop()
        if (p in fsm.finals) != (q in fsm.finals):
            return True
        for symbol in symbols:
            pair = (fsm.map[p].get(symbol, dead) if p is not None else dead, fsm.map[q].get(symbol, dead) if q is not None else dead)
            if (pair[0] is None) != (pair[1] is None):
                return True  # every state is live: one can still reach acceptance, the dead one cannot
            if pair[0] is not None and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return False


@pytest.mark.parametrize("pattern", PATTERNS)
def test_no_two_states_of_the_minimised_automaton_are_equivalent(pattern):
    fsm = byte_automaton.ByteAutomaton(pattern).fsm
    if len(fsm.states) > 60:
        pytest.skip("the pairwise search is for small automata")
    for one, other in itertools.combinations(fsm.states, 2):
        assert distinguishable(fsm, one, other), f"{pattern}: states {one} and {other} are equivalent, not merged"


@pytest.mark.parametrize("pattern, minimum", [(r"(a|b)*abb", 4), (r"(aa|aaa)*", 3), (r"(ab|c)*d", 3), (r"a{3}|b{3}", 6),
                                              (r"[0-9]{1,3}", 4), (r"(x|xx|xxx)", 4)])
def test_minimised_state_count_is_the_known_minimum(pattern, minimum):
    """(a|b)*abb: the textbook's 4 states (how much of "abb" the text ends with); (aa|aaa)*: every length but 1,
    so 3 states (length 0, length 1, 2 or more); a{3}|b{3}: the start, two partial a's, two partial b's, done."""
    automaton = byte_automaton.ByteAutomaton(pattern)
    assert len(automaton.fsm.states) == minimum, f"{pattern}: {len(automaton.fsm.states)} states, the minimum is {minimum}"


def test_the_language_check_catches_two_inequivalent_states_merged():
    """The check above can fail: merging two states that differ (the start of (a|b)*abb and the state after
    "a") makes an automaton that accepts "bb", which the comparison with interegular's automaton reports."""
    automaton = byte_automaton.ByteAutomaton(r"(a|b)*abb")
    fsm = automaton.fsm
    after_a = fsm.map[fsm.initial][fsm.alphabet["a"]]
    merged_map = {state: {symbol: (fsm.initial if target == after_a else target) for symbol, target in moves.items()}
                  for state, moves in fsm.map.items() if state != after_a}
    merged = FSM(alphabet=fsm.alphabet, states=set(merged_map), initial=fsm.initial, finals=fsm.finals - {after_a},
                 map=merged_map, __no_validation__=True)
    assert first_difference(merged, interegular_automaton(r"(a|b)*abb"), ["a", "b"], 6) is not None


def test_minimise_leaves_out_states_from_which_nothing_is_accepted():
    """Moves into states that cannot reach acceptance are dropped, as interegular drops the dead state."""
    automaton = byte_automaton.ByteAutomaton(r"ab|cd")
    assert len(automaton.fsm.states) == 4
    assert automaton.step(automaton.initial, ord("x")) is None
    assert automaton.live == set(automaton.fsm.states)
