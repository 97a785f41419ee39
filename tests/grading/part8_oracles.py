"""Part 8's oracles, shared by its test files: GPT-2's byte table written out from its definition,
small byte vocabularies with languages written out member by member, partial matching with the
``regex`` module, and a brute-force walk that checks a token index state by state."""

from __future__ import annotations

import bisect
import functools
import itertools
import re

import regex
import torch

try:  # Python's own regular-expression parser (named sre_parse before 3.11)
    from re import _constants as _c, _parser
except ImportError:  # pragma: no cover
    import sre_constants as _c
    import sre_parse as _parser


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


@functools.cache
def _compiled(pattern: str):
    """``pattern`` compiled once: ``regex.fullmatch(pattern, ...)`` looks it up in the module's cache on every
    call, which costs more than the match itself for the thousands of calls a brute-force walk makes."""
    return regex.compile(pattern)


def partial_ok(pattern: str, text: bytes, every: bool = False) -> bool:
    """Whether ``text`` (bytes, perhaps ending inside a character) can be completed into a match of ``pattern``
    (``every``: try every character an unfinished one could become, not one per stretch; see ``completions``)."""
    for cut in range(len(text), max(len(text) - 4, -1), -1):
        try:
            head = text[:cut].decode()
        except UnicodeDecodeError:
            continue
        tail = text[cut:]
        if not tail:
            return _compiled(pattern).fullmatch(head, partial=True) is not None
        # An unfinished character: try the characters it could become (the vocabularies here
        # split 2- and 3-byte characters only).
        return any(_compiled(pattern).fullmatch(head + char, partial=True) for char in completions(pattern, tail, every))
    return False


@functools.cache
def completions(pattern: str, tail: bytes, every: bool = False) -> tuple[str, ...]:
    """The characters whose UTF-8 bytes begin with ``tail`` (an unfinished 2- or 3-byte character), as far as
    ``pattern`` can tell them apart: one per stretch of code points that no literal or range of the pattern
    begins or ends inside (see ``_cuts``), or all of them with ``every`` or when the pattern has constructs
    that ``_cuts`` does not read. A lead byte of a 3-byte character has 4,096 completions, and the regex
    call for each was most of a brute-force walk's time; a stretch's characters all match alike."""
    length = 2 if 0xC2 <= tail[0] <= 0xDF else 3 if 0xE0 <= tail[0] <= 0xEF else 0
    if len(tail) >= length:
        return ()
    every_char = []
    for rest in itertools.product(range(0x80, 0xC0), repeat=length - len(tail)):
        try:
            every_char.append((tail + bytes(rest)).decode())
        except UnicodeDecodeError:
            continue
    cuts = None if every else _cuts(pattern)
    if cuts is None or not every_char:
        return tuple(every_char)
    codes = sorted(ord(char) for char in every_char)
    bounds = sorted({codes[0]} | {cut for cut in cuts if codes[0] < cut <= codes[-1]})
    picked = []
    for start, end in zip(bounds, bounds[1:] + [codes[-1] + 1]):
        first = bisect.bisect_left(codes, start)  # the stretch's first valid character, if it has one
        if first < len(codes) and codes[first] < end:
            picked.append(chr(codes[first]))
    return tuple(picked)


@functools.cache
def _cuts(pattern: str) -> tuple[int, ...] | None:
    """The code points at which ``pattern`` may start treating characters differently: each literal's own
    code point and the one after it, each range's ends, and the newline around ``.``. Two characters
    between the same neighbouring cuts are in exactly the same literals, ranges and classes, so the
    pattern matches a text with one where and only where it matches it with the other. None when the
    pattern uses what this reading does not cover (\\w-style categories, case folding, backreferences,
    lookarounds): then every character is tried. Read with Python's own regular-expression parser."""
    try:
        parsed = _parser.parse(pattern)
    except Exception:  # noqa: BLE001 - anything this parser refuses is simply tried character by character
        return None
    if parsed.state.flags & (re.IGNORECASE | re.LOCALE):
        return None
    cuts = {10, 11}
    todo = list(parsed)
    while todo:
        op, arg = todo.pop()
        if op in (_c.LITERAL, _c.NOT_LITERAL):
            cuts.update((arg, arg + 1))
        elif op is _c.RANGE:
            cuts.update((arg[0], arg[1] + 1))
        elif op is _c.IN:
            todo.extend(arg)
        elif op is _c.SUBPATTERN:
            todo.extend(arg[-1])
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            todo.extend(arg[2])
        elif op is _c.BRANCH:
            for branch in arg[1]:
                todo.extend(branch)
        elif op not in (_c.ANY, _c.AT, _c.NEGATE):
            return None
    return tuple(sorted(cuts))


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


def allowed_by_oracle(vocabulary, eos: int, text: bytes, prefixes: set[bytes], full: set[bytes]) -> set[int]:
    allowed = {i for i, t in enumerate(vocabulary) if t is not None and text + t in prefixes}
    return allowed | ({eos} if text in full else set())



def check_index_by_brute_force(index, vocabulary, eos, allowed_after, depth: int, what: str) -> int:
    """Follow every allowed token sequence up to ``depth`` tokens; compare each allowed set with the oracle.
    Returns how many states were compared."""
    # One slice reads every row as plain dicts (the fast index keeps its rows in arrays until they are read).
    transitions = index.transitions[:]
    assert transitions and isinstance(transitions[0], dict), f"{what}: transitions must be a list of dicts"
    done = -1
    todo = [(b"", 0, 0)]
    compared = 0
    while todo:
        text, state, level = todo.pop()
        row = transitions[state]
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
            assert 0 <= target < len(transitions), f"{what}: token {vocabulary[token]!r} leads to {target}, not a state"
            if level < depth:
                todo.append((text + vocabulary[token], target, level + 1))
    return compared



def completed_texts(constraint, out: torch.Tensor, width: int, eos: int) -> list[tuple[list[int], str]]:
    """Each row's tokens up to and including EOS, and their text (the rows start after ``width`` prompt columns)."""
    rows = []
    for row in out[:, width:].tolist():
        assert eos in row, f"a row never reached the end-of-text token: {row}"
        end = row.index(eos)
        rows.append((row[: end + 1], b"".join(constraint.vocabulary[t] for t in row[:end]).decode("utf-8", "replace")))
    return rows
