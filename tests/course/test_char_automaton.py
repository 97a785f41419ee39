"""Part 8's given automaton over characters (``char_automaton.py``): the position construction gives the same
language as interegular's own construction, checked as automata: both minimised, they are the same automaton
state for state (``minimise`` numbers states breadth-first in symbol order, so two automata of one language over
one alphabet come out equal). Given code, the same in solutions/ and exercises/, so tested here once, in one
process; each comparison renumbers one side's symbols as the other numbers them (``over``)."""

import gc

import interegular
import pytest

from solutions import byte_automaton, char_automaton, json_schema

# Every construct: literals, classes and their complements, the dot, unions, concatenations, stars, pluses,
# optionals, counted repeats (exact, bounded, open), nested groups, the empty option, characters of several
# bytes, and a JSON schema's expression (strings with escapes, repeats of repeats).
PATTERNS = [
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
    r" (Ivy|Max|Mia|Tom) had a (dog|cat|rabbit) named [A-Z][a-z]{1,10}\.", r"\[(-?[0-9]{1,6}(, -?[0-9]{1,6}){0,9})?\]",
    r" (café|cat|the) (big|é)+€?", r"(ab|c)*d", r"a[bc]*é?", r"(a|b)*abb(a|b){0,3}", r"(x|y|xy)*z{2,4}|q",
    r"(a|ab)(c|bcd)(d*)", r"(aa|aaa)*", r"\d+(\.\d+)?|-\d{1,3}", ".\u2040?", r"[^é€]b|", r"(a{2,}|b?){1,3}c",
    r"\w\W\s\S\D.", r"((ab)*|c+)+", r"x{0}y",
    json_schema.schema_to_regex({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "pet": {"enum": ["dog", "a.b", None]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3}}}),
]


def canonical(fsm):
    """The minimised automaton, as plain data."""
    merged = char_automaton.minimise(fsm, byte_automaton.ByteAutomaton._live_states(fsm))
    return merged.initial, merged.finals, merged.map


def over(fsm, alphabet):
    """``fsm`` with its symbols numbered as ``alphabet`` numbers the same classes of characters. Two alphabets of
    one expression group the characters alike, but may number the groups in another order: interegular numbers
    them in the order of a set, which can differ between two builds in one process, not only between processes."""
    assert set(fsm.alphabet) == set(alphabet), "the two alphabets name different characters"
    renumber = {}
    for char, symbol in fsm.alphabet.items():
        assert renumber.setdefault(symbol, alphabet[char]) == alphabet[char], (
            f"the two alphabets group the characters differently ({char!r})")
    assert sorted(renumber.values()) == sorted(set(dict(alphabet.items()).values())), "the alphabets' groups differ"
    transitions = {state: {renumber[symbol]: to for symbol, to in row.items()} for state, row in fsm.map.items()}
    return interegular.fsm.FSM(alphabet=alphabet, states=fsm.states, initial=fsm.initial, finals=fsm.finals,
                               map=transitions)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_position_construction_has_interegulars_language(pattern):
    parsed = interegular.parse_pattern(pattern)
    ours = char_automaton.PositionAutomaton(parsed).to_fsm()
    with char_automaton.hashed_crawl():
        theirs = parsed.to_fsm()
    assert canonical(over(ours, theirs.alphabet)) == canonical(theirs), (
        f"{pattern}: the position construction's language differs from interegular's")


def test_the_comparison_can_fail():
    """Two expressions over the same alphabet whose languages differ only in the empty run ("ad") give
    different minimised automata."""
    parsed, other = interegular.parse_pattern(r"a[bc]*d"), interegular.parse_pattern(r"a[bc]+d")
    theirs = other.to_fsm()
    assert canonical(over(char_automaton.PositionAutomaton(parsed).to_fsm(), theirs.alphabet)) != canonical(theirs)


@pytest.mark.parametrize("pattern", [r"a(?=bc)b.", r"(?i:ab)c", r"(?i)ab"])
def test_lookarounds_and_flags_are_left_to_interegular(pattern):
    parsed = interegular.parse_pattern(pattern)
    with pytest.raises(char_automaton._NotCovered):
        char_automaton.PositionAutomaton(parsed)
    with char_automaton.hashed_crawl():
        theirs = parsed.to_fsm()
    assert canonical(char_automaton.character_automaton(pattern)) == canonical(theirs)


def test_the_collector_is_paused_only_inside_the_block():
    assert gc.isenabled()
    with char_automaton.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with char_automaton.collector_paused():
            pass
        assert not gc.isenabled(), "a collector that was off before must stay off"
    finally:
        gc.enable()
