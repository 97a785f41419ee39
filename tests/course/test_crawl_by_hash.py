"""Part 8's given automaton over characters compiles the expressions its position construction does not cover
(lookarounds, inline flags) with interegular, through ``crawl_by_hash`` (``hashed_crawl``), a dict-based
stand-in for interegular's list search. Given code, the same in solutions/ and exercises/, so it
is tested here once, in one process: interegular numbers an expression's transitions in the order of a set
of characters, which changes with the process's string hashing, so automata built in two processes cannot
be compared entry for entry."""

import pytest
from interegular import parse_pattern

from solutions import byte_automaton


def list_crawl(alphabet, initial, final, follow):
    """The subset construction as interegular 0.3 writes it: each state found by a linear search of a list."""
    from interegular.fsm import FSM, OblivionError

    states, finals, moves = [initial], set(), {}
    for i, state in enumerate(states):
        if final(state):
            finals.add(i)
        moves[i] = {}
        for transition in alphabet.by_transition:
            try:
                target = follow(state, transition)
            except OblivionError:
                continue
            if target not in states:
                states.append(target)
            moves[i][transition] = states.index(target)
    return FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals, map=moves, __no_validation__=True)


# Concatenations, unions, stars, repeats, classes with escapes, and characters of several bytes.
PATTERNS = [r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
            r'\{"name": "[^"\\]{0,6}", "n": -?[1-9]\d?\}', r" (café|cat|the) (big|é)+€?", r"(ab|c)*d", r"a[bc]*é?",
            r"(a|b)*abb(a|b){0,3}", r"(x|y|xy)*z{2,4}|q"]


# Expressions the position construction leaves to interegular: a lookahead, a negative one, inline flags.
NOT_COVERED = [r"a(?=bc)b.", r"x(?!y)[a-z]{1,3}", r"(?i:ab)c"]


@pytest.mark.parametrize("pattern", PATTERNS + NOT_COVERED)
def test_crawl_by_hash_builds_interegular_automata_state_for_state(monkeypatch, pattern):
    """The same states, numbers, moves and finals as the list search it replaces, for concatenations, unions
    (states that are dicts), stars and repeats (sets); and the byte automaton is compiled through it where the
    position construction does not apply (tests/course/test_char_automaton.py checks the others)."""
    import interegular.fsm

    built = {}
    for name, crawl in (("list", list_crawl), ("hash", byte_automaton.crawl_by_hash)):
        monkeypatch.setattr(interegular.fsm, "crawl", crawl)
        fsm = parse_pattern(pattern).to_fsm()
        built[name] = (fsm.initial, fsm.finals, fsm.map)
    assert built["hash"] == built["list"], f"{pattern}: crawl_by_hash numbers or links the states differently"
    if pattern not in NOT_COVERED:
        return
    monkeypatch.setattr(interegular.fsm, "crawl", list_crawl)
    fsm = byte_automaton.ByteAutomaton(pattern).compiled  # interegular's automaton, before merging states
    assert (fsm.initial, fsm.finals, fsm.map) == built["list"]
    assert interegular.fsm.crawl is list_crawl, "hashed_crawl left interegular changed"
