"""Part 8, the token index: ``token_bytes``, ``walk_token`` and ``build_index`` (and the fast index the
course's constraints use), against GPT-2's byte table, brute force, Python's ``re`` and outlines-core.

How the tests judge:

* ``token_bytes`` is compared with GPT-2's byte table written out here from its definition,
  and checked on real encodings: the bytes of the tokens of any text, joined, are the
  text's UTF-8 bytes, also when a character's bytes are split over tokens.
* ``walk_token`` and ``build_index`` are compared with a brute-force walk: for small
  vocabularies of byte tokens (some of them halves of multi-byte characters) and languages
  written out member by member, every token sequence the index allows (up to a depth) is
  followed, and at each step the allowed set must be exactly the tokens that keep the text a
  byte prefix of some member; the end-of-text token exactly where the text is a member.
  Infinite languages use the ``regex`` module's partial matching as the oracle.
* The automaton reads character classes as ``re`` does with ``re.ASCII``: checked character by
  character against ``re.fullmatch(..., re.ASCII)``.
* ``build_index_fast`` (given code) passes the same brute-force walks; ``build_index`` must equal
  it state for state on real vocabularies; the fast index agrees with outlines-core's index (when
  that library is installed; in the full suite, not in a check of ``build_index``) on every
  token sequence.
"""

from __future__ import annotations

import functools
import re

import pytest
import regex
from interegular import parse_pattern

from part8_oracles import (FINITE_LANGUAGES, INFINITE_PATTERNS, SMALL_EOS, SMALL_VOCAB, allowed_by_oracle, byte_prefixes,
                           check_index_by_brute_force, completions, oracle_vocabulary, partial_ok)


@functools.cache
def allowed_after_partial(pattern: str, text: bytes) -> frozenset[int]:
    """The oracle of the infinite languages: the tokens of SMALL_VOCAB after which ``text`` can still be
    completed into a match of ``pattern`` (the ``regex`` module's partial matching), and the end-of-text
    token when ``text`` is a whole match. Cached: several token sequences reach the same text, and both
    indexes are walked with the same questions."""
    allowed = {i for i, t in enumerate(SMALL_VOCAB) if t is not None and partial_ok(pattern, text + t)}
    try:
        complete = regex.fullmatch(pattern, text.decode()) is not None
    except UnicodeDecodeError:
        complete = False
    return frozenset(allowed | ({SMALL_EOS} if complete else set()))


@pytest.fixture(scope="module")
def st(impl):
    """The index's module."""
    return impl.token_index


@pytest.fixture(scope="module")
def automaton_of(impl):
    return impl.byte_automaton.ByteAutomaton


@pytest.fixture(scope="module")
def fast(impl):
    return impl.fast_index


@pytest.fixture(scope="module")
def tiny_vocab(tiny):
    return oracle_vocabulary(tiny.tokenizer)


@pytest.mark.exercise("walk_token")
def test_finite_languages_are_written_out_right():
    """The member lists above are exactly the languages of their patterns (the test's own data)."""
    for name, (pattern, members) in FINITE_LANGUAGES.items():
        assert all(re.fullmatch(pattern, m) for m in members), name
        strings = {"".join(chars) for chars in parse_pattern(pattern).to_fsm().strings()}
        assert strings == set(members), name


# Patterns whose literals and ranges cut the runs of 2- and 3-byte characters (and \w, which the shortcut leaves alone).
SHORTCUT_PATTERNS = INFINITE_PATTERNS + [r"[à-ÿ]+|x€", r"[^é€]b", r".\u2040?", r"\w€"]


@pytest.mark.parametrize("pattern", SHORTCUT_PATTERNS)
def test_partial_matching_tries_enough_characters(pattern):
    """The oracle's shortcut (the test's own machinery): after an unfinished character, trying one character
    per stretch of code points the pattern cannot tell apart answers as trying every one of its completions."""
    answers = set()
    for head in [b"", b"a", b"ab", b'"', b"x"]:
        for tail in [b"\xc3", b"\xe2", b"\xe2\x82", b"\xe2\x81", b"\xed"]:
            quick = partial_ok(pattern, head + tail)
            assert quick == partial_ok(pattern, head + tail, every=True), (pattern, head + tail)
            answers.add(quick)
    if pattern != "(ab|c)*d":  # (its language has no character past ASCII)
        assert answers == {True, False}, "test design: both answers should occur"
    # A 3-byte character's lead has 4,096 completions: all are tried only where the shortcut does not apply.
    assert (len(completions(pattern, b"\xe2")) == 4096) == (pattern == r"\w€")


# ---------------------------------------------------------------------------------------
# token_bytes
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("token_bytes")
def test_token_bytes_follow_gpt2s_byte_table(st, tiny, story):
    """Every token's bytes, read through GPT-2's byte table; special tokens are None."""
    for reference in (tiny, story):
        tokenizer = reference.tokenizer
        got = st.token_bytes(tokenizer)
        expected = oracle_vocabulary(tokenizer)
        assert len(got) == len(expected), f"{len(got)} entries, the tokenizer has {len(expected)} tokens"
        assert got[tokenizer.eos_token_id] is None, "the end-of-text token is not text: its entry must be None"
        wrong = [(i, got[i], expected[i]) for i in range(len(got)) if got[i] != expected[i]]
        assert not wrong, f"token {wrong[0][0]} ({tokenizer.convert_ids_to_tokens(wrong[0][0])!r}): got {wrong[0][1]!r}, expected {wrong[0][2]!r}"


@pytest.mark.exercise("token_bytes")
def test_token_bytes_join_into_the_texts_utf8_even_across_split_characters(st, tiny):
    """For texts whose accented letters, euro signs and emoji are split over several tokens, the
    tokens' bytes joined are exactly the text's UTF-8 bytes (no replacement characters)."""
    tokenizer = tiny.tokenizer
    vocabulary = st.token_bytes(tokenizer)
    for text in ["The cat sat.", "café au lait", "Preis: 5 €", "naïve façade", "emoji 🙂 ok", "tab\tand\nnewline"]:
        ids = tokenizer.encode(text)
        split = [i for i in ids if not _valid_utf8(vocabulary[i])]
        joined = b"".join(vocabulary[i] for i in ids)
        assert joined == text.encode(), f"{text!r}: the tokens' bytes join into {joined!r}, not {text.encode()!r}"
        if any(ord(c) > 127 for c in text):
            assert split, "test design: expected some token that is not valid UTF-8 on its own"


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False



# ---------------------------------------------------------------------------------------
# walk_token and build_index
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("walk_token")
@pytest.mark.parametrize("language", FINITE_LANGUAGES)
def test_walk_token_reads_a_token_exactly_when_it_stays_in_the_language(st, language, automaton_of):
    """From the start and from states after each allowed first token: a token is read exactly when the
    text stays a byte prefix of a member, and it ends where stepping byte by byte ends."""
    pattern, members = FINITE_LANGUAGES[language]
    prefixes, _ = byte_prefixes(members)
    automaton = automaton_of(pattern)
    starts = [(b"", automaton.initial)]
    for token in SMALL_VOCAB[:-1]:
        state = _step_bytes(automaton, automaton.initial, token)
        if state is not None:
            starts.append((token, state))
    for text, state in starts:
        for token in SMALL_VOCAB[:-1]:
            got = st.walk_token(automaton, state, token)
            allowed = text + token in prefixes
            assert (got is not None) == allowed, (
                f"{language}: after {text!r}, walk_token(token {token!r}) gave {got}, but {text + token!r} "
                f"{'is' if allowed else 'is not'} the beginning of a member"
            )
            if allowed:
                assert got == _step_bytes(automaton, state, token), f"{language}: after {text!r} + {token!r}, wrong state"
    assert st.walk_token(automaton, automaton.initial, b"") is None


def _step_bytes(automaton, state, token: bytes):
    for byte in token:
        state = automaton.step(state, byte)
        if state is None:
            return None
    return state



@pytest.mark.parametrize("language", FINITE_LANGUAGES)
def test_index_matches_a_brute_force_walk_on_finite_languages(st, language, automaton_of):
    """Allowed tokens after every token sequence the index allows: exactly those that keep the text a
    byte prefix of a member; EOS exactly where the text is a member (and it leads to DONE)."""
    pattern, members = FINITE_LANGUAGES[language]
    prefixes, full = byte_prefixes(members)
    index = st.build_index(automaton_of(pattern), SMALL_VOCAB, SMALL_EOS)
    assert index.eos_token_id == SMALL_EOS
    compared = check_index_by_brute_force(
        index, SMALL_VOCAB, SMALL_EOS, lambda text: allowed_by_oracle(SMALL_VOCAB, SMALL_EOS, text, prefixes, full), 8, language
    )
    assert compared > 5


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("pattern", INFINITE_PATTERNS)
def test_index_matches_a_brute_force_walk_on_infinite_languages(st, pattern, automaton_of):
    """Languages without an end: the oracle is partial matching with the ``regex`` module."""
    index = st.build_index(automaton_of(pattern), SMALL_VOCAB, SMALL_EOS)
    check_index_by_brute_force(index, SMALL_VOCAB, SMALL_EOS, lambda text: allowed_after_partial(pattern, text), 2, pattern)


@pytest.mark.exercise("build_index")
def test_index_numbers_states_from_zero_and_reaches_each_one(st, automaton_of):
    """State 0 is the start; every state is reached from state 0, and every state allows some token
    (a state with nothing allowed would leave a row stuck)."""
    index = st.build_index(automaton_of(r"(ab|ba)+c|é€"), SMALL_VOCAB, SMALL_EOS)
    seen, todo = {0}, [0]
    while todo:
        for target in index.transitions[todo.pop()].values():
            if target != -1 and target not in seen:
                seen.add(target)
                todo.append(target)
    assert seen == set(range(len(index.transitions))), f"states {sorted(set(range(len(index.transitions))) - seen)} are never reached"
    assert all(index.transitions), "a state allows no token at all"
    with pytest.raises(ValueError, match="eos_token_id"):
        st.build_index(automaton_of("a"), SMALL_VOCAB, len(SMALL_VOCAB))


@pytest.mark.exercise("build_index")
def test_index_over_a_real_vocabulary(st, tiny, tiny_vocab, automaton_of):
    """The stand-in's 1024 tokens and a pattern with a character split over tokens: brute force to depth 3."""
    pattern, members = r" (café|cat|the) (big|é)", [f" {a} {b}" for a in ("café", "cat", "the") for b in ("big", "é")]
    prefixes, full = byte_prefixes(members)
    eos = tiny.tokenizer.eos_token_id
    index = st.build_index(automaton_of(pattern), tiny_vocab, eos)
    check_index_by_brute_force(index, tiny_vocab, eos, lambda text: allowed_by_oracle(tiny_vocab, eos, text, prefixes, full), 3, pattern)



# ---------------------------------------------------------------------------------------
# Character classes, as re reads them with re.ASCII
# ---------------------------------------------------------------------------------------

CLASS_PATTERNS = [r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", r"[\d_]", r"[^\s]", r"\d{2}", r"[a-z\d]+\.", r"."]
# ASCII, then other scripts' digits, letters and spaces (Arabic-Indic 3, fullwidth 5, é, ß, NBSP,
# em space, the ASCII separators 0x1c-0x1f, NEL, a mathematical digit past U+FFFF) and an emoji.
CLASS_TEXTS = [chr(c) for c in range(128)] + ["٣", "５", "é", "ß", "\u00a0", "\u2003", "\x85", "𝟘", "😀", "٣٣", "12", "a1.", "é1."]


def automaton_accepts(automaton, text: str) -> bool:
    state = automaton.initial
    for byte in text.encode():
        state = automaton.step(state, byte)
        if state is None:
            return False
    return automaton.is_accepting(state)


@pytest.mark.exercise("walk_token")
@pytest.mark.parametrize("pattern", CLASS_PATTERNS)
def test_character_classes_are_read_as_re_reads_them_with_re_ascii(automaton_of, pattern):
    """The course's convention: ``\\d``, ``\\w``, ``\\s`` (and their complements) are ASCII classes, as with
    ``re.ASCII``. Every text is accepted exactly when ``re.fullmatch(pattern, text, re.ASCII)`` matches it."""
    automaton = automaton_of(pattern)
    for text in CLASS_TEXTS:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert automaton_accepts(automaton, text) == expected, f"{pattern!r} on {text!r}: re.ASCII says {expected}"


@pytest.mark.exercise("walk_token")
def test_the_convention_is_not_res_default():
    """Why the flag must be stated: without it, ``re`` reads ``\\d`` as any decimal digit (the automaton does not)."""
    assert re.fullmatch(r"\d", "٣") and not re.fullmatch(r"\d", "٣", re.ASCII)
    assert re.fullmatch(r"\s", "\u00a0") and not re.fullmatch(r"\s", "\u00a0", re.ASCII)


# ---------------------------------------------------------------------------------------
# The fast index (given code): brute force, build_index and outlines-core
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("language", FINITE_LANGUAGES)
def test_fast_index_matches_a_brute_force_walk_on_finite_languages(fast, automaton_of, language):
    """The fast index passes the same brute-force walks as build_index."""
    pattern, members = FINITE_LANGUAGES[language]
    prefixes, full = byte_prefixes(members)
    index = fast.build_index_fast(automaton_of(pattern), SMALL_VOCAB, SMALL_EOS)
    check_index_by_brute_force(
        index, SMALL_VOCAB, SMALL_EOS, lambda text: allowed_by_oracle(SMALL_VOCAB, SMALL_EOS, text, prefixes, full), 8, language
    )


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("pattern", INFINITE_PATTERNS)
def test_fast_index_matches_a_brute_force_walk_on_infinite_languages(fast, automaton_of, pattern):
    index = fast.build_index_fast(automaton_of(pattern), SMALL_VOCAB, SMALL_EOS)
    check_index_by_brute_force(index, SMALL_VOCAB, SMALL_EOS, lambda text: allowed_after_partial(pattern, text), 2, pattern)




# Patterns over real vocabularies: the bench's four, characters split over tokens, repetition, a JSON-like
# object, and classes with escapes.
REAL_PATTERNS = [
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
    r" (Ivy|Max|Mia|Tom) had a (dog|cat|rabbit) named [A-Z][a-z]{1,10}\.",
    r"\[(-?[0-9]{1,6}(, -?[0-9]{1,6}){0,9})?\]",
    r" (café|cat|the) (big|é)+€?",
    r'\{"name": "[^"\\]{0,6}", "n": -?[1-9]\d?\}',
]


@pytest.fixture(scope="module")
def real_indexes(st, fast, automaton_of, tiny_vocab, tiny):
    """``build_index``'s index of a pattern over the stand-in's vocabulary, built once for the two tests below
    that read it, and a fast index built afresh (each from its own automaton): its rows become dicts as they
    are read, and the second test reads them from the arrays."""
    eos = tiny.tokenizer.eos_token_id
    built = functools.cache(lambda pattern: st.build_index(automaton_of(pattern), tiny_vocab, eos))
    return lambda pattern: (built(pattern), fast.build_index_fast(automaton_of(pattern), tiny_vocab, eos))


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("pattern", REAL_PATTERNS)
def test_build_index_equals_the_fast_index_on_real_vocabularies(real_indexes, pattern):
    """Same states, numbered the same way (breadth-first, tokens in id order), same rows, on the stand-in's
    vocabulary (the fast index is checked against brute force above and against outlines-core below)."""
    got, expected = real_indexes(pattern)
    assert got.n_states == expected.n_states, f"{got.n_states} states, the fast index has {expected.n_states}"
    for state, (row, want) in enumerate(zip(got.transitions, expected.transitions[:])):
        assert row == want, f"state {state}: tokens {sorted(set(row) ^ set(want))[:6]} differ, or lead elsewhere"


def same_as_outlines(index, oc_index, eos: int) -> str | None:
    """None when our index and outlines-core's allow the same tokens after every token sequence; else where not.

    outlines-core minimises its automaton, so one of its states may stand for several of ours: the two are
    compared as a relation (pairs of states reached by the same tokens), not as a renumbering."""
    transitions, rows = oc_index.get_transitions(), index.transitions[:]
    seen, todo = {(0, oc_index.get_initial_state())}, [(0, oc_index.get_initial_state())]
    while todo:
        ours, theirs = todo.pop()
        row, their_row = rows[ours], transitions.get(theirs, {})
        if set(row) != set(their_row):
            return f"state {ours}: only ours allows {sorted(set(row) - set(their_row))[:5]}, only theirs {sorted(set(their_row) - set(row))[:5]}"
        for token, target in row.items():
            pair = (target, their_row[token])
            if token != eos and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return None


# No exercise mark: this checks the given fast index against outlines-core and runs no code of yours, so a check of
# build_index leaves it to the full suite (most installs skip it anyway: outlines-core comes with the bench extra).
@pytest.mark.parametrize("pattern", REAL_PATTERNS[:4])
def test_fast_index_agrees_with_outlines_core(fast, automaton_of, story, pattern):
    """outlines-core's index (its own automaton, walked in Rust) allows the same tokens after every sequence, on
    the story model's vocabulary. Skipped without outlines-core (the bench extra). Only patterns whose accepting
    states allow nothing but EOS: outlines-core 0.2.14 drops a token that leaves an accepting state for one that
    is not (for ``(ab)+`` it refuses "a" after "ab"), which the brute-force walks above show is allowed."""
    outlines_core = pytest.importorskip("outlines_core")
    vocabulary = oracle_vocabulary(story.tokenizer)
    eos = story.tokenizer.eos_token_id
    table: dict[bytes, list[int]] = {}
    for token_id, token in enumerate(vocabulary):
        if token is not None:
            table.setdefault(token, []).append(token_id)
    theirs = outlines_core.Index(pattern, outlines_core.Vocabulary(eos, table))
    ours = fast.build_index_fast(automaton_of(pattern), vocabulary, eos)
    assert same_as_outlines(ours, theirs, eos) is None, same_as_outlines(ours, theirs, eos)


@pytest.mark.exercise("build_index")
def test_fast_index_on_degenerate_vocabularies(st, fast, automaton_of):
    """No readable token, empty tokens, duplicate tokens and NUL bytes: the same index as build_index."""
    for vocabulary in ([None, None], [b"", None], [b"a", None, b"a", b"ab", b"\0", b"\0a"]):
        for pattern in ["a?", "a*b?", "\0a?"]:
            expected = st.build_index(automaton_of(pattern), vocabulary, 1).transitions
            assert fast.build_index_fast(automaton_of(pattern), vocabulary, 1).transitions[:] == expected, (vocabulary, pattern)


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("pattern", REAL_PATTERNS[4:])
def test_the_fast_index_rows_read_as_a_list_of_dicts(st, real_indexes, tiny_vocab, tiny, impl, pattern):
    """``IndexRows``: each row a dict equal to build_index's (also by negative index and slice); and the mask table
    filled from its arrays equals the one filled from plain dicts. (The first pattern has accepting states that
    allow more than EOS; the order of a row's entries is free.) tests/course/test_index_rows.py checks the rest
    of the sequence's behaviour: equality, the IndexError past the end."""
    eos = tiny.tokenizer.eos_token_id
    plain, index = real_indexes(pattern)
    rows = index.transitions
    assert len(rows) == len(plain.transitions) and rows[-1] == plain.transitions[-1] and rows[1:3] == plain.transitions[1:3]
    assert rows[:] == plain.transitions
    from_arrays = impl.token_constraint.TokenConstraint(index, tiny_vocab)
    from_dicts = impl.token_constraint.TokenConstraint(st.TokenIndex([dict(row) for row in plain.transitions], eos), tiny_vocab)
    assert from_arrays.allowed.equal(from_dicts.allowed)
    assert int(from_dicts.allowed.sum()) == sum(map(len, plain.transitions)) + 1
