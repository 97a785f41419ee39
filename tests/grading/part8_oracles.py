"""Part 8's oracles, shared by its test files: GPT-2's byte table written out from its definition,
small byte vocabularies with languages written out member by member, partial matching with the
``regex`` module, and a brute-force walk that checks a token index state by state."""

from __future__ import annotations

import functools
import itertools

import regex
import torch


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


def partial_ok(pattern: str, text: bytes) -> bool:
    """Whether ``text`` (bytes, perhaps ending inside a character) can be completed into a match of ``pattern``."""
    for cut in range(len(text), max(len(text) - 4, -1), -1):
        try:
            head = text[:cut].decode()
        except UnicodeDecodeError:
            continue
        tail = text[cut:]
        if not tail:
            return _compiled(pattern).fullmatch(head, partial=True) is not None
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
            if _compiled(pattern).fullmatch(head + char, partial=True):
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
