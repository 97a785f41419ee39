"""Part 8's given fast index keeps its rows in arrays (``IndexRows``) and reads them as a list of dicts.
Given code, the same in solutions/ and exercises/: its sequence behaviour is tested here once, in one
process (the grading tests read its rows as plain data)."""

import pytest

from solutions import byte_automaton, fast_index, token_index

VOCABULARY = [b"a", b"b", b"ab", None, b"ba", b"c", b"abc"]
EOS = 3


@pytest.mark.parametrize("pattern", [r"(ab|c)*", r"a?b{1,3}c?", r"(a|b)*abc"])
def test_index_rows_behave_as_the_list_of_dicts_build_index_writes(pattern):
    plain = token_index.build_index(byte_automaton.ByteAutomaton(pattern), VOCABULARY, EOS)
    index = fast_index.build_index_fast(byte_automaton.ByteAutomaton(pattern), VOCABULARY, EOS)
    rows = index.transitions
    assert isinstance(rows, fast_index.IndexRows) and isinstance(plain.transitions, list)
    assert rows == plain.transitions and plain.transitions == rows and index == plain
    assert [rows[s] for s in range(-len(rows), 0)] == plain.transitions
    assert rows[1:] == plain.transitions[1:] and rows[::-1] == plain.transitions[::-1]
    with pytest.raises(IndexError):
        rows[len(rows)]
    changed = [dict(row) for row in plain.transitions]
    changed[-1][EOS] = 0
    assert rows != changed
