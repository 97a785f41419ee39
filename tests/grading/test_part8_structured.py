"""Part 8: structured generation, against brute force, Python's ``re``, ``json`` and ``jsonschema``.

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
* ``TokenConstraint`` is checked on a hand-written index (independent of ``build_index``).
* ``generate(..., constraint=...)``: every completed text of fuzzed expressions and seeds
  matches (``re.fullmatch``), under several temperatures and filters; greedy decoding takes
  the argmax of the allowed tokens; the constraint ends rows by itself. The law of the
  sampled token sequences is compared with the exact law of mask-and-renormalise computed
  here by enumeration on the reference model's logits (Hugging Face's model, penalty and
  warpers, applied after the mask): support first, then Pearson's chi-square against
  ``scipy.stats.chi2.isf(ALPHA / TAIL_SAFETY, df)``, so that a correct implementation fails
  with probability at most ``ALPHA`` = 1e-6 per test (the safety factor covers the
  approximation's error in the far tail, as in part 7). The sample size is the smallest
  that catches a law at chi-square distance ``DETECT_DISTANCE`` with probability ``POWER``
  (noncentral chi-square).
* ``schema_to_regex``: random instances of a schema, written by ``json.dumps``, must match;
  random members of the expression (random walks on its automaton) must parse with ``json``
  and validate with ``jsonschema``.
* ``exact_laws`` and ``kl_divergence``: hand-computed toys; and ``enumerate_language`` +
  ``exact_laws`` on the stand-in model against a brute-force computation of both laws.

Seeded tests take their seed from ``SAMPLING_COURSE_TEST_SEED`` (default 0); any seed must pass.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections import Counter

import jsonschema
import pytest
import regex
import torch
from interegular import parse_pattern
from interegular.fsm import anything_else
from scipy.stats import chi2, ncx2
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from sampling_course.implementation import load_demo

ALPHA = 1e-6  # the false-failure probability of each statistical test below
TAIL_SAFETY = 10  # Pearson's statistic has a heavier far tail than chi-square at these sizes (see part 7)
POWER = 0.999
DETECT_DISTANCE = 0.1
MIN_EXPECTED = 20.0

# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


def gpt2_byte_table() -> dict[str, int]:
    """GPT-2's character -> byte table, transcribed from its definition (``bytes_to_unicode`` in
    OpenAI's encoder.py): printable bytes stand for themselves, the others get 256, 257, ... in order."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def oracle_vocabulary(tokenizer) -> list[bytes | None]:
    table = gpt2_byte_table()
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    return [None if i in special else bytes(table[c] for c in name) for i, name in enumerate(names)]


def byte_prefixes(members: list[str]) -> tuple[set[bytes], set[bytes]]:
    """Every byte prefix of a member, and the members, as UTF-8 bytes."""
    full = {m.encode() for m in members}
    return {m[:i] for m in full for i in range(len(m) + 1)}, full


def partial_ok(pattern: str, text: bytes) -> bool:
    """Whether ``text`` (bytes, perhaps ending inside a character) can be completed into a match of ``pattern``."""
    for cut in range(len(text), max(len(text) - 4, -1), -1):
        try:
            head = text[:cut].decode()
        except UnicodeDecodeError:
            continue
        tail = text[cut:]
        if not tail:
            return regex.fullmatch(pattern, head, partial=True) is not None
        # An unfinished character: try every character it could become (the vocabularies here
        # split 2- and 3-byte characters only).
        length = 2 if 0xC2 <= tail[0] <= 0xDF else 3 if 0xE0 <= tail[0] <= 0xEF else 0
        if len(tail) >= length:
            return False
        for rest in itertools.product(range(0x80, 0xC0), repeat=length - len(tail)):
            try:
                char = (tail + bytes(rest)).decode()
            except UnicodeDecodeError:
                continue
            if regex.fullmatch(pattern, head + char, partial=True):
                return True
        return False
    return False


# A vocabulary of byte tokens: whole words, single bytes, and halves of "é" (c3 a9) and "€" (e2 82 ac).
SMALL_VOCAB: list[bytes | None] = [
    b"a", b"b", b"c", b"ab", b"ba", b"bc", b"abc", b" ", b"a ", b" \xc3", b"\xc3", b"\xa9", b"\xc3\xa9",
    b"\xe2", b"\x82", b"\xac", b"\xe2\x82", b"\x82\xac", b"\xe2\x82\xac", b"\xac1", b"1", b"2", b"12",
    b"9", b"0", b"x", b"\xff", b"d", b"\"", b"\xa9\"", None,
]
SMALL_EOS = len(SMALL_VOCAB) - 1

# Finite languages, member by member, and a pattern for each (checked against the list below).
FINITE_LANGUAGES = {
    "words": (r"abc?|bac?|a é|€1", ["ab", "abc", "ba", "bac", "a é", "€1"]),
    "numbers": (r"[1-9][0-9]?", [str(n) for n in range(1, 100)]),
    "accents": (r"(é|c)(a|é)?€?", [x + y + z for x in ("é", "c") for y in ("", "a", "é") for z in ("", "€")]),
}
INFINITE_PATTERNS = [r"(ab|c)*d", r'"[^"]*"', r"a[bc]*é?"]


@pytest.mark.exercise("walk_token")
def test_finite_languages_are_written_out_right():
    """The member lists above are exactly the languages of their patterns (the test's own data)."""
    for name, (pattern, members) in FINITE_LANGUAGES.items():
        assert all(re.fullmatch(pattern, m) for m in members), name
        strings = {"".join(chars) for chars in parse_pattern(pattern).to_fsm().strings()}
        assert strings == set(members), name


def allowed_by_oracle(vocabulary, eos: int, text: bytes, prefixes: set[bytes], full: set[bytes]) -> set[int]:
    allowed = {i for i, t in enumerate(vocabulary) if t is not None and text + t in prefixes}
    return allowed | ({eos} if text in full else set())


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def st(impl):
    return impl.structured


@pytest.fixture(scope="module")
def gen(impl):
    return impl.generate


@pytest.fixture(scope="module")
def tiny_model(tiny, impl):
    return load_demo(tiny, impl.transformer)


@pytest.fixture(scope="module")
def tiny_vocab(tiny):
    return oracle_vocabulary(tiny.tokenizer)


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
def test_walk_token_reads_a_token_exactly_when_it_stays_in_the_language(st, language):
    """From the start and from states after each allowed first token: a token is read exactly when the
    text stays a byte prefix of a member, and it ends where stepping byte by byte ends."""
    pattern, members = FINITE_LANGUAGES[language]
    prefixes, _ = byte_prefixes(members)
    automaton = st.ByteAutomaton(pattern)
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


def _check_index_by_brute_force(index, vocabulary, eos, allowed_after, depth: int, what: str) -> int:
    """Follow every allowed token sequence up to ``depth`` tokens; compare each allowed set with the oracle.
    Returns how many states were compared."""
    assert index.transitions and isinstance(index.transitions[0], dict), f"{what}: transitions must be a list of dicts"
    done = -1
    todo = [(b"", 0, 0)]
    compared = 0
    while todo:
        text, state, level = todo.pop()
        row = index.transitions[state]
        expected = allowed_after(text)
        compared += 1
        assert set(row) == expected, (
            f"{what}: after {text!r} the index allows tokens {sorted(vocabulary[t] if t != eos else 'EOS' for t in set(row) - expected)[:6]} "
            f"that it must not, and misses {sorted(vocabulary[t] if t != eos else 'EOS' for t in expected - set(row))[:6]}"
        )
        if eos in row:
            assert row[eos] == done, f"{what}: the end-of-text token must lead to DONE (-1), got {row[eos]}"
        for token, target in row.items():
            if token == eos:
                continue
            assert 0 <= target < len(index.transitions), f"{what}: token {vocabulary[token]!r} leads to {target}, not a state"
            if level < depth:
                todo.append((text + vocabulary[token], target, level + 1))
    return compared


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("language", FINITE_LANGUAGES)
def test_index_matches_a_brute_force_walk_on_finite_languages(st, language):
    """Allowed tokens after every token sequence the index allows: exactly those that keep the text a
    byte prefix of a member; EOS exactly where the text is a member (and it leads to DONE)."""
    pattern, members = FINITE_LANGUAGES[language]
    prefixes, full = byte_prefixes(members)
    index = st.build_index(st.ByteAutomaton(pattern), SMALL_VOCAB, SMALL_EOS)
    assert index.eos_token_id == SMALL_EOS
    compared = _check_index_by_brute_force(
        index, SMALL_VOCAB, SMALL_EOS, lambda text: allowed_by_oracle(SMALL_VOCAB, SMALL_EOS, text, prefixes, full), 8, language
    )
    assert compared > 5


@pytest.mark.exercise("build_index")
@pytest.mark.parametrize("pattern", INFINITE_PATTERNS)
def test_index_matches_a_brute_force_walk_on_infinite_languages(st, pattern):
    """Languages without an end: the oracle is partial matching with the ``regex`` module."""

    def allowed_after(text: bytes) -> set[int]:
        allowed = {i for i, t in enumerate(SMALL_VOCAB) if t is not None and partial_ok(pattern, text + t)}
        try:
            complete = regex.fullmatch(pattern, text.decode()) is not None
        except UnicodeDecodeError:
            complete = False
        return allowed | ({SMALL_EOS} if complete else set())

    index = st.build_index(st.ByteAutomaton(pattern), SMALL_VOCAB, SMALL_EOS)
    _check_index_by_brute_force(index, SMALL_VOCAB, SMALL_EOS, allowed_after, 2, pattern)


@pytest.mark.exercise("build_index")
def test_index_numbers_states_from_zero_and_reaches_each_one(st):
    """State 0 is the start; every state is reached from state 0, and every state allows some token
    (a state with nothing allowed would leave a row stuck)."""
    index = st.build_index(st.ByteAutomaton(r"(ab|ba)+c|é€"), SMALL_VOCAB, SMALL_EOS)
    seen, todo = {0}, [0]
    while todo:
        for target in index.transitions[todo.pop()].values():
            if target != -1 and target not in seen:
                seen.add(target)
                todo.append(target)
    assert seen == set(range(len(index.transitions))), f"states {sorted(set(range(len(index.transitions))) - seen)} are never reached"
    assert all(index.transitions), "a state allows no token at all"
    with pytest.raises(ValueError, match="eos_token_id"):
        st.build_index(st.ByteAutomaton("a"), SMALL_VOCAB, len(SMALL_VOCAB))


@pytest.mark.exercise("build_index")
def test_index_over_a_real_vocabulary(st, tiny, tiny_vocab):
    """The stand-in's 1024 tokens and a pattern with a character split over tokens: brute force to depth 3."""
    pattern, members = r" (café|cat|the) (big|é)", [f" {a} {b}" for a in ("café", "cat", "the") for b in ("big", "é")]
    prefixes, full = byte_prefixes(members)
    eos = tiny.tokenizer.eos_token_id
    index = st.build_index(st.ByteAutomaton(pattern), tiny_vocab, eos)
    _check_index_by_brute_force(index, tiny_vocab, eos, lambda text: allowed_by_oracle(tiny_vocab, eos, text, prefixes, full), 3, pattern)


# ---------------------------------------------------------------------------------------
# TokenConstraint, on a hand-written index
# ---------------------------------------------------------------------------------------

# Tokens a, b, c, EOS. State 0: a -> 1, c -> 1. State 1: b -> 0, EOS -> DONE. So the language is ((a|c)b)*(a|c).
HAND_VOCAB = [b"a", b"b", b"c", None]


def hand_constraint(st):
    index = st.TokenIndex([{0: 1, 2: 1}, {1: 0, 3: -1}], eos_token_id=3)
    return st.TokenConstraint(index, HAND_VOCAB, d_vocab=5)


@pytest.mark.exercise("TokenConstraint")
def test_mask_sets_exactly_the_forbidden_tokens_to_minus_infinity(st, seed):
    """Each row: -inf (or -1e10 and below) where its state forbids a token, its own logit elsewhere; DONE allows only EOS."""
    constraint = hand_constraint(st)
    logits = torch.randn(5, 5, generator=torch.Generator().manual_seed(seed))
    states = torch.tensor([0, 1, -1, 1, 0])
    got = constraint.mask_logits(logits.clone(), states)
    allowed = {0: [0, 2], 1: [1, 3], -1: [3]}
    for row, state in enumerate(states.tolist()):
        for token in range(5):
            if token in allowed[state]:
                assert got[row, token] == logits[row, token], f"row {row} (state {state}): allowed token {token} changed"
            else:  # -inf, or a number so negative that softmax gives it exactly 0 (a -1e10 mask)
                assert got[row, token] <= -1e9, f"row {row} (state {state}): token {token} must be -inf, got {got[row, token]}"
    with pytest.raises(ValueError, match="d_vocab"):
        constraint.mask_logits(torch.zeros(2, 4), torch.tensor([0, 1]))


@pytest.mark.exercise("TokenConstraint")
def test_advance_follows_the_index_and_finished_rows_stay_done(st):
    """Each row moves along its token; EOS leads to DONE (the row is finished); a DONE row stays DONE
    whatever it reads; a token the state forbids is a ValueError."""
    constraint = hand_constraint(st)
    states = constraint.start(4)
    assert states.tolist() == [0, 0, 0, 0]
    states = constraint.advance(states, torch.tensor([0, 2, 0, 2]))
    assert states.tolist() == [1, 1, 1, 1]
    states = constraint.advance(states, torch.tensor([1, 3, 3, 1]))
    assert states.tolist() == [0, -1, -1, 0], f"after b, EOS, EOS, b: expected states [0, -1, -1, 0], got {states.tolist()}"
    assert constraint.finished(states).tolist() == [False, True, True, False]
    states = constraint.advance(states, torch.tensor([0, 3, 4, 2]))  # finished rows read pads (3 or 4)
    assert states.tolist() == [1, -1, -1, 1], f"finished rows must stay DONE, got {states.tolist()}"
    with pytest.raises(ValueError, match="token"):
        constraint.advance(torch.tensor([0]), torch.tensor([1]))


# ---------------------------------------------------------------------------------------
# generate(..., constraint=...)
# ---------------------------------------------------------------------------------------

PROMPTS = ["Once upon a time", "The", "She looked at the door and"]
FUZZ_PATTERNS = [
    r" (cat|dog|the big door)\.",
    r"[a-z]{1,6}( [a-z]{1,4})?",
    r" [0-9]{1,3}(\.[0-9])?",
    r"( |é|caf)+é{0,2}!",
    r'\{"name": "[a-zé]{0,5}", "n": -?[1-9]\}',
]
FUZZ_SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=1.5, top_k=5),
    dict(temperature=0.8, top_p=0.7, repetition_penalty=1.3),
    dict(temperature=2.0, min_p=0.05, presence_penalty=0.5),
]


def completed_texts(st, constraint, out: torch.Tensor, width: int, eos: int) -> list[tuple[list[int], str]]:
    rows = []
    for row in out[:, width:].tolist():
        assert eos in row, f"a row never reached the end-of-text token: {row}"
        end = row.index(eos)
        rows.append((row[: end + 1], b"".join(constraint.vocabulary[t] for t in row[:end]).decode("utf-8", "replace")))
    return rows


@pytest.mark.exercise("constrained_generate")
@pytest.mark.parametrize("pattern", FUZZ_PATTERNS)
def test_every_generated_text_matches(st, gen, tiny, tiny_model, pattern, seed):
    """Fuzzed: several temperatures, filters and penalties, two seeds each; every row ends with EOS and
    its text matches the pattern as a whole; after EOS a row holds only pads."""
    tokenizer = tiny.tokenizer
    constraint = st.regex_constraint(pattern, tokenizer)
    eos = tokenizer.eos_token_id
    for i, settings in enumerate(FUZZ_SETTINGS):
        out = gen.generate(tiny_model, tokenizer, PROMPTS, 40, constraint=constraint, seed=seed * 100 + i, **settings)
        width = max(len(tokenizer.encode(p)) for p in PROMPTS)
        for r, (tokens, text) in enumerate(completed_texts(st, constraint, out, width, eos)):
            assert re.fullmatch(pattern, text), f"{settings}, row {r}: generated {text!r}, which does not match {pattern!r}"
            after = out[r, width + len(tokens) :].tolist()
            assert all(t == eos for t in after), f"{settings}, row {r}: tokens after EOS must be pads, got {after}"


@pytest.mark.exercise("constrained_generate")
def test_greedy_takes_the_best_allowed_token(st, gen, tiny, tiny_model):
    """Temperature 0: every token is the argmax of the model's logits over the allowed tokens (oracle:
    Hugging Face's logits and the allowed sets of a brute-force walk over the members)."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    members = [f" {a} {b}." for a in ("cat", "dog", "door", "the") for b in ("is", "was", "sat")]
    pattern = r" (cat|dog|door|the) (is|was|sat)\."
    prefixes, full = byte_prefixes(members)
    vocabulary = oracle_vocabulary(tokenizer)
    constraint = st.regex_constraint(pattern, tokenizer)
    for prompt in PROMPTS:
        out = gen.generate(tiny_model, tokenizer, [prompt], 20, constraint=constraint, temperature=0.0)
        ids = tokenizer.encode(prompt)
        new = out[0, len(ids) :].tolist()
        text = b""
        for i, token in enumerate(new):
            allowed = sorted(allowed_by_oracle(vocabulary, eos, text, prefixes, full))
            with torch.no_grad():
                logits = tiny.hf_model(torch.tensor([ids + new[:i]])).logits[0, -1]
            best = allowed[int(logits[allowed].argmax())]
            assert token == best or abs(logits[token] - logits[best]) < 1e-4, (
                f"prompt {prompt!r}, step {i}: generated {vocabulary[token]!r}, the best allowed token is {vocabulary[best]!r}"
            )
            if token == eos:
                break
            text += vocabulary[token]
        assert text.decode() in members


@pytest.mark.exercise("constrained_generate")
def test_the_constraint_ends_rows_without_the_eos_criterion(st, gen, tiny, tiny_model, seed):
    """With generate's own end-of-text stopping switched off (eos_token_id=-1), a row still ends when its
    constraint reads EOS: its later tokens are pads (id 0 here), and the batch stops when all rows are done."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    pattern = r"[a-c]{1,3}"
    constraint = st.regex_constraint(pattern, tokenizer)
    out = gen.generate(tiny_model, tokenizer, PROMPTS, 30, constraint=constraint, eos_token_id=-1, seed=seed)
    width = max(len(tokenizer.encode(p)) for p in PROMPTS)
    assert out.shape[1] - width <= 4, f"every row is done after at most 4 tokens, yet the batch ran {out.shape[1] - width} steps"
    for r, row in enumerate(out[:, width:].tolist()):
        assert eos in row, f"row {r} never read EOS: {row}"
        end = row.index(eos)
        text = b"".join(constraint.vocabulary[t] for t in row[:end]).decode()
        assert re.fullmatch(pattern, text), f"row {r}: {text!r}"
        assert all(t == 0 for t in row[end + 1 :]), f"row {r}: after EOS, expected pads (0), got {row[end + 1:]}"


def chi2_threshold(df: int) -> float:
    return chi2.isf(ALPHA / TAIL_SAFETY, df)


def sample_size(df: int) -> int:
    threshold = chi2_threshold(df)
    n = 1
    while ncx2.sf(threshold, df, n * DETECT_DISTANCE) < POWER:
        n = math.ceil(n * 1.05) + 1
    return n


def assert_frequencies_match(observed: Counter, expected: dict, n: int, what: str) -> None:
    """Support first, then Pearson's chi-square (outcomes expected fewer than MIN_EXPECTED times pooled)."""
    impossible = {o: c for o, c in observed.items() if expected.get(o, 0.0) == 0.0}
    assert not impossible, f"{what}: token sequences of probability 0 were generated: {list(impossible)[:3]}"
    cells = sorted((o for o, p in expected.items() if p > 0), key=lambda o: expected[o])
    rare: list = []
    while cells and (n * expected[cells[0]] < MIN_EXPECTED or (rare and n * sum(expected[c] for c in rare) < MIN_EXPECTED)):
        rare.append(cells.pop(0))
    groups = [[c] for c in cells] + ([rare] if rare else [])
    assert len(groups) >= 2, "test design: too few cells"
    seen = [sum(observed[c] for c in g) for g in groups]
    wanted = [n * sum(expected[c] for c in g) for g in groups]
    statistic = sum((o - e) ** 2 / e for o, e in zip(seen, wanted))
    threshold = chi2_threshold(len(groups) - 1)
    if statistic > threshold:
        worst = max(range(len(groups)), key=lambda i: abs(seen[i] - wanted[i]) / math.sqrt(wanted[i]))
        pytest.fail(
            f"{what}: the generated sequences do not follow the exact law of mask-and-renormalise (chi-square "
            f"{statistic:.1f} > {threshold:.1f}, df={len(groups) - 1}, n={n}); e.g. {groups[worst][0] if len(groups[worst]) == 1 else 'rare ones'}: "
            f"{seen[worst] / n:.4f}, exact {wanted[worst] / n:.4f}",
            pytrace=False,
        )


def exact_masked_law(hf_model, prompt_ids, vocabulary, eos, members, settings) -> dict[tuple[int, ...], float]:
    """The probability of every token sequence (EOS included) that masked sampling can produce, by enumeration:
    Hugging Face's logits, its repetition penalty, the mask of allowed tokens, then its warpers."""
    prefixes, full = byte_prefixes(members)
    processors = LogitsProcessorList()
    if settings.get("repetition_penalty", 1.0) != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    warpers = LogitsProcessorList([TemperatureLogitsWarper(settings.get("temperature", 1.0))])
    if settings.get("top_k"):
        warpers.append(TopKLogitsWarper(settings["top_k"]))
    if settings.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(settings["top_p"]))
    law: dict[tuple[int, ...], float] = {}
    frontier = [((), b"", 1.0)]
    while frontier:
        ids = torch.tensor([prompt_ids + list(tokens) for tokens, _, _ in frontier])
        with torch.no_grad():
            all_logits = hf_model(ids).logits[:, -1].double()
        next_frontier = []
        for (tokens, text, prob), logits, row_ids in zip(frontier, all_logits, ids):
            logits = processors(row_ids[None], logits[None].float()).double()[0]
            allowed = sorted(allowed_by_oracle(vocabulary, eos, text, prefixes, full))
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            probs = warpers(row_ids[None], masked[None])[0].softmax(-1)
            for token in allowed:
                if probs[token] == 0:
                    continue
                if token == eos:
                    law[tokens + (eos,)] = prob * probs[token].item()
                else:
                    next_frontier.append((tokens + (token,), text + vocabulary[token], prob * probs[token].item()))
        frontier = next_frontier
    return law


LAW_SETTINGS = [
    pytest.param(dict(temperature=1.0), id="T1"),
    pytest.param(dict(temperature=0.7, top_k=2), id="T0.7-topk2"),
    pytest.param(dict(temperature=1.3, top_p=0.8, repetition_penalty=1.5), id="T1.3-topp0.8-rep1.5"),
]


@pytest.mark.exercise("constrained_generate")
@pytest.mark.parametrize("settings", LAW_SETTINGS)
def test_sampled_sequences_follow_the_exact_masked_law(st, gen, tiny, tiny_model, settings, seed):
    """The law of the generated token sequences equals mask-and-renormalise's, computed exactly by enumeration
    (mask before temperature and filters). Chi-square: false-failure probability <= 1e-6."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    members = [f" {a} {b}" for a in ("cat", "dog", "the") for b in ("sat", "ran")] + [" cat"]
    pattern = r" (cat|dog|the) (sat|ran)| cat"
    prompt = "Once upon a time"
    prompt_ids = tokenizer.encode(prompt)
    expected = exact_masked_law(tiny.hf_model, prompt_ids, oracle_vocabulary(tokenizer), eos, members, settings)
    n = sample_size(sum(p > 0 for p in expected.values()) - 1)
    constraint = st.regex_constraint(pattern, tokenizer)
    out = gen.generate(tiny_model, tokenizer, [prompt] * n, 12, constraint=constraint, seed=seed, **settings)
    observed = Counter()
    for row in out[:, len(prompt_ids) :].tolist():
        assert eos in row, f"a row did not finish: {row}"
        observed[tuple(row[: row.index(eos) + 1])] += 1
    assert_frequencies_match(observed, expected, n, f"generate(constraint, {settings})")


@pytest.mark.exercise("constrained_generate")
def test_generate_rejects_something_that_is_not_a_constraint(gen, tiny, tiny_model):
    with pytest.raises(TypeError, match="constraint"):
        gen.generate(tiny_model, tiny.tokenizer, ["The"], 3, constraint="[a-z]+")


# ---------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer"},
        "pet": {"enum": ["dog", "a.b*c", 3, None, True, "qu\"o"]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "scores": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"enum": ["a", "b"]}}},
    },
}
# A schema in JSON Schema's own vocabulary for the validator: every key required, no others, the sizes kept.
VALIDATOR_SCHEMA = json.loads(json.dumps(SCHEMA))
for _obj in (VALIDATOR_SCHEMA, VALIDATOR_SCHEMA["properties"]["inner"]):
    _obj["required"] = list(_obj["properties"])
    _obj["additionalProperties"] = False

CHARS = ["a", "z", "Q", " ", "\"", "\\", "/", "é", "€", "🙂", "\n", "\x01", "0", "-", "{", ","]


def random_instance(schema: dict, rng: random.Random):
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "integer":
        return rng.choice([0, 7, -3, 10, 123456, -1000]) if rng.random() < 0.5 else rng.randint(-10**6, 10**6)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 8)
        return "".join(rng.choice(CHARS) for _ in range(rng.randint(low, high)))
    if kind == "array":
        low, high = schema.get("minItems", 0), schema.get("maxItems", 4)
        return [random_instance(schema["items"], rng) for _ in range(rng.randint(low, high))]
    return {key: random_instance(value, rng) for key, value in schema["properties"].items()}


def random_members(pattern: str, rng: random.Random, n: int, max_len: int = 80) -> list[str]:
    """``n`` random texts of the pattern's language: random walks on its automaton that head for an accepting state."""
    fsm = parse_pattern(pattern).to_fsm()
    distance = {s: 0 for s in fsm.finals}
    changed = True
    while changed:
        changed = False
        for s, moves in fsm.map.items():
            best = min((distance[t] + 1 for t in moves.values() if t in distance), default=None)
            if best is not None and best < distance.get(s, math.inf):
                distance[s], changed = best, True
    by_symbol: dict = {}
    for char, symbol in fsm.alphabet.items():
        if char is not anything_else:
            by_symbol.setdefault(symbol, []).append(char)
    other = [c for c in CHARS + ["x", "ü", "#"] if c not in fsm.alphabet]
    members = []
    for _ in range(n):
        state, text = fsm.initial, ""
        while not (state in fsm.finals and (rng.random() < 0.15 or len(text) > max_len)):
            moves = [(symbol, t) for symbol, t in fsm.map[state].items() if t in distance]
            if len(text) > max_len:
                moves = [min(moves, key=lambda m: distance[m[1]])]
            symbol, state = rng.choice(moves)
            text += rng.choice(by_symbol.get(symbol, []) + (other if symbol == fsm.alphabet[anything_else] else []))
        members.append(text)
    return members


@pytest.mark.exercise("schema_to_regex")
def test_every_instance_of_the_schema_matches(st, seed):
    """Random instances (quotes, backslashes, control characters, emoji in strings; negative numbers), written
    by json.dumps(ensure_ascii=False), all match the expression."""
    pattern = st.schema_to_regex(SCHEMA)
    rng = random.Random(seed)
    for _ in range(300):
        text = json.dumps(random_instance(SCHEMA, rng), ensure_ascii=False)
        assert re.fullmatch(pattern, text), f"a valid instance does not match: {text}"


@pytest.mark.exercise("schema_to_regex")
def test_every_member_of_the_expression_is_a_valid_instance(st, seed):
    """Random members of the expression (random walks on its automaton) parse with json, validate against
    the schema, and keep the keys in the schema's order."""
    pattern = st.schema_to_regex(SCHEMA)
    rng = random.Random(seed)
    for text in random_members(pattern, rng, 300):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            pytest.fail(f"the expression matches {text!r}, which is not JSON ({exc})", pytrace=False)
        try:
            jsonschema.validate(value, VALIDATOR_SCHEMA)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"the expression matches {text!r}, which breaks the schema: {exc.message}", pytrace=False)
        assert list(value) == list(SCHEMA["properties"]), f"keys out of order in {text!r}"


@pytest.mark.exercise("schema_to_regex")
def test_small_schemas_have_exactly_their_texts(st):
    """Finite schemas: the expression's language is exactly the set of json.dumps texts."""
    cases = [
        ({"enum": ["a", "b.c", 1]}, ['"a"', '"b.c"', "1"]),
        ({"type": "boolean"}, ["true", "false"]),
        ({"type": "array", "items": {"enum": [1, 2]}, "maxItems": 2}, ["[]", "[1]", "[2]", "[1, 1]", "[1, 2]", "[2, 1]", "[2, 2]"]),
        ({"type": "array", "items": {"enum": [0]}, "minItems": 2, "maxItems": 3}, ["[0, 0]", "[0, 0, 0]"]),
        ({"type": "object", "properties": {"k": {"enum": [True]}, "j": {"type": "array", "items": {"enum": [0]}, "maxItems": 0}}},
         ['{"k": true, "j": []}']),
    ]
    for schema, texts in cases:
        strings = itertools.islice(parse_pattern(st.schema_to_regex(schema)).to_fsm().strings(), 100)
        got = {"".join(chars) for chars in strings}
        assert got == set(texts), f"{schema}: the expression's texts are {sorted(got)}, expected {sorted(texts)}"
    for bad in ({"type": "number"}, {"type": "string", "pattern": "a"}, {"type": "object", "properties": {"a": {"type": "integer"}}, "required": []}):
        with pytest.raises(ValueError):
            st.schema_to_regex(bad)


@pytest.mark.exercise("schema_to_regex")
def test_the_story_model_writes_valid_json_for_every_seed(st, gen, story, impl, seed):
    """json_schema_constraint on the story model: every seed gives an object that parses and validates. (The fields
    are bounded: an integer field has no length limit, and the story model, which has hardly seen digits, may not end
    one; integers are fuzzed in test_every_generated_text_matches.)"""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "pet": {"enum": ["dog", "cat"]},
                                               "likes": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3},
                                               "ok": {"type": "boolean"}}}
    validator = {**schema, "required": ["name", "pet", "likes", "ok"], "additionalProperties": False}
    model = load_demo(story, impl.transformer)
    constraint = st.json_schema_constraint(schema, story.tokenizer)
    prompts = ["Once upon a time, there was a little girl named Ivy."] * 4
    out = gen.generate(model, story.tokenizer, prompts, 60, constraint=constraint, seed=seed)
    width = len(story.tokenizer.encode(prompts[0]))
    for tokens, text in completed_texts(st, constraint, out, width, story.tokenizer.eos_token_id):
        jsonschema.validate(json.loads(text), validator)


# ---------------------------------------------------------------------------------------
# The distortion: exact_laws, kl_divergence, enumerate_language
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("kl_divergence")
def test_kl_divergence_of_a_hand_computed_toy(st):
    """p = (1/2, 1/4, 1/4), q = (1/4, 1/4, 1/2): KL(p || q) = 1/2 ln 2 + 0 + 1/4 ln(1/2) = ln(2) / 4;
    KL(q || p) = 1/4 ln(1/2) + 1/2 ln 2 = ln(2) / 4 as well; a term with p = 0 adds nothing;
    q = 0 where p > 0 gives infinity."""
    p = {"a": 0.5, "b": 0.25, "c": 0.25}
    q = {"a": 0.25, "b": 0.25, "c": 0.5}
    assert st.kl_divergence(p, q) == pytest.approx(math.log(2) / 4, rel=1e-12)
    assert st.kl_divergence(q, p) == pytest.approx(math.log(2) / 4, rel=1e-12)
    skewed = {"a": 0.9, "b": 0.1, "c": 0.0}
    # 0.9 ln(0.9 / 0.25) + 0.1 ln(0.1 / 0.25), the c term is 0
    assert st.kl_divergence(skewed, q) == pytest.approx(0.9 * math.log(3.6) + 0.1 * math.log(0.4), rel=1e-12)
    assert st.kl_divergence(q, skewed) == math.inf
    assert st.kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


def toy_path(st, tokens, text, logprobs, masses):
    return st.LanguagePath(tuple(tokens), text, tuple(math.log(x) for x in logprobs), tuple(math.log(x) for x in masses))


@pytest.mark.exercise("exact_laws")
def test_exact_laws_of_a_hand_computed_toy(st):
    """Three paths, two of them spelling "ab" (tokens a+b, and ab):

    * a, b:  model 0.2 * 0.5 = 0.1,  masked (0.2 / 0.4) * (0.5 / 0.5) = 0.5
    * ab:    model 0.1,              masked 0.1 / 0.4 = 0.25
    * c:     model 0.1,              masked 0.1 / 0.4 = 0.25

    So p("ab" | L) = 0.2 / 0.3 = 2/3, p("c" | L) = 1/3; q("ab") = 0.75, q("c") = 0.25."""
    paths = [
        toy_path(st, [0, 1], "ab", [0.2, 0.5], [0.4, 0.5]),
        toy_path(st, [2], "ab", [0.1], [0.4]),
        toy_path(st, [3], "c", [0.1], [0.4]),
    ]
    p, q = st.exact_laws(paths)
    assert set(p) == set(q) == {"ab", "c"}
    assert p["ab"] == pytest.approx(2 / 3, rel=1e-9) and p["c"] == pytest.approx(1 / 3, rel=1e-9)
    assert q["ab"] == pytest.approx(0.75, rel=1e-9) and q["c"] == pytest.approx(0.25, rel=1e-9)


@pytest.mark.exercise("exact_laws")
def test_exact_laws_keep_tiny_probabilities(st):
    """Paths of probability 1e-300 and below (long texts under a model that dislikes them) still give the right
    conditional: work in log space."""
    paths = [
        st.LanguagePath((0,), "x", (-800.0,), (-1.0,)),
        st.LanguagePath((1,), "y", (-800.0 + math.log(3),), (-1.0,)),
    ]
    p, q = st.exact_laws(paths)
    assert p["x"] == pytest.approx(0.25, rel=1e-9) and p["y"] == pytest.approx(0.75, rel=1e-9)


def brute_force_laws(hf_model, prompt_ids, vocabulary, members) -> tuple[dict[str, float], dict[str, float]]:
    """Both laws by enumerating every token sequence that spells a member (prefix-free language)."""
    prefixes, full = byte_prefixes(members)
    p: dict[str, float] = Counter()
    q: dict[str, float] = Counter()
    frontier = [((), b"", 1.0, 1.0)]
    while frontier:
        ids = torch.tensor([prompt_ids + list(t) for t, *_ in frontier])
        with torch.no_grad():
            probs = hf_model(ids).logits[:, -1].double().softmax(-1)
        next_frontier = []
        for (tokens, text, pp, qq), row in zip(frontier, probs):
            allowed = [i for i, t in enumerate(vocabulary) if t is not None and text + t in prefixes]
            mass = row[allowed].sum().item()
            for token in allowed:
                child = (tokens + (token,), text + vocabulary[token], pp * row[token].item(), qq * row[token].item() / mass)
                if child[1] in full:
                    p[child[1].decode()] += child[2]
                    q[child[1].decode()] += child[3]
                else:
                    next_frontier.append(child)
        frontier = next_frontier
    total = sum(p.values())
    return {x: v / total for x, v in p.items()}, dict(q)


@pytest.mark.exercise("exact_laws")
def test_enumerated_laws_equal_a_brute_force_computation(st, impl, tiny, tiny_model):
    """enumerate_language + exact_laws on the stand-in model equal both laws computed here by brute force over
    every tokenization of every member (Hugging Face's logits), to 1e-4 relative; the KL agrees too."""
    members = [f" {a} {b}." for a in ("cat", "dog", "the door") for b in ("sat", "ran", "is é")]
    pattern = r" (cat|dog|the door) (sat|ran|is é)\."
    prompt = "Once upon a time"
    tokenizer = tiny.tokenizer
    constraint = st.regex_constraint(pattern, tokenizer)
    language = st.enumerate_language(tiny_model, tokenizer, prompt, constraint, skip_below=1e-30)
    assert language.skipped_q_mass == 0.0
    p, q = st.exact_laws(language.paths)
    p_true, q_true = brute_force_laws(tiny.hf_model, tokenizer.encode(prompt), oracle_vocabulary(tokenizer), members)
    assert set(p) == set(p_true) == set(members)
    for x in members:
        assert p[x] == pytest.approx(p_true[x], rel=1e-4), f"p({x!r} | L)"
        assert q[x] == pytest.approx(q_true[x], rel=1e-4), f"q({x!r})"
    assert st.kl_divergence(p, q) == pytest.approx(st.kl_divergence(p_true, q_true), rel=1e-3, abs=1e-9)
