"""Part 8: the token index. The vocabulary as bytes, reading a token, and every state's allowed tokens.

A text may go on with a token only if every byte of the token keeps it inside the language
(``walk_token``). The index records, for every state that some sequence of tokens reaches,
the tokens allowed there and the state each leads to (``build_index``): after that,
constrained generation needs no automaton, only table lookups. ``build_index`` is written
the plain way, one ``walk_token`` per (state, token) pair; ``fast_index.py`` builds the same
index with every token walked at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .byte_automaton import ByteAutomaton

# The state of a row that has read the end-of-text token: finished, and only EOS may follow.
DONE = -1

# ---------------------------------------------------------------------------------------
# The vocabulary as bytes
# ---------------------------------------------------------------------------------------


def token_bytes(tokenizer) -> list[bytes | None]:
    """The bytes each token of a GPT-2-style (byte-level BPE) tokenizer stands for, by token id.

    GPT-2 stores each token as a string in which every byte is written as one printable
    character: the printable bytes ``!``-``~``, ``¡``-``¬`` and ``®``-``ÿ`` as themselves,
    the other 68 bytes (space, control bytes, ...) as the characters from U+0100 on, in
    byte order (so the space, byte 32, is "Ġ"). Reading that table backwards gives the
    bytes. Tokens are bytes, not text: a token may end in the middle of a multi-byte
    character, and then it is not valid UTF-8 on its own.

    Special tokens (``tokenizer.all_special_ids``, such as ``<|endoftext|>``) are not text:
    their entry is None. Returns a list with one entry per token id, ``len(tokenizer)`` long.
    """
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    ### BEGIN SOLUTION
    # Hint: build the byte -> character table of GPT-2 first, then read every token through its inverse.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_of_byte = {b: chr(b) for b in printable}
    for shifted, b in enumerate(b for b in range(256) if b not in char_of_byte):
        char_of_byte[b] = chr(256 + shifted)
    byte_of_char = {char: b for b, char in char_of_byte.items()}
    special = set(tokenizer.all_special_ids)
    return [None if token_id in special else bytes(byte_of_char[c] for c in name) for token_id, name in enumerate(names)]
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Reading a token, and the index
# ---------------------------------------------------------------------------------------


def walk_token(automaton: ByteAutomaton, state: int, token: bytes) -> int | None:
    """The state after reading all of ``token``'s bytes from ``state``, or None if any byte is refused.

    A token may be read only if *every* byte of it keeps the text inside the language:
    the automaton must accept each byte in turn. (An empty token reads nothing: None.)
    """
    if not token:
        return None
    ### BEGIN SOLUTION
    # Hint: one step per byte, and a single refused byte rules out the whole token.
    for byte in token:
        state = automaton.step(state, byte)
        if state is None:
            return None
    return state
    ### END SOLUTION


@dataclass
class TokenIndex:
    """For every state a text can reach token by token, the tokens allowed there and where each leads.

    ``transitions[s]`` maps token id -> next state; state 0 is the start. The end-of-text
    token is in ``transitions[s]`` exactly when the text is a complete member in state s,
    and it leads to ``DONE``.
    """

    transitions: list[dict[int, int]]
    eos_token_id: int

    @property
    def n_states(self) -> int:
        return len(self.transitions)

    def is_accepting(self, state: int) -> bool:
        return self.eos_token_id in self.transitions[state]


def build_index(automaton: ByteAutomaton, vocabulary: Sequence[bytes | None], eos_token_id: int) -> TokenIndex:
    """The token index of ``automaton`` over ``vocabulary`` (token id -> bytes, None for special tokens).

    Explore the states breadth-first from ``automaton.initial``: for each state, try every
    token with ``walk_token``; each token that can be read is allowed there and leads to
    the state it ends in, which is explored in turn. Number the states in the order they
    are first reached, the initial state 0. In every accepting state the end-of-text
    token is allowed too, and leads to ``DONE``; nowhere else.
    """
    if not isinstance(eos_token_id, int) or not 0 <= eos_token_id < len(vocabulary):
        raise ValueError(f"eos_token_id must be a token id in [0, {len(vocabulary)}), got {eos_token_id!r}")
    ### BEGIN SOLUTION
    # Hint: a queue of automaton states and a dict automaton state -> index state; a state's row is done when it leaves the queue.
    number = {automaton.initial: 0}
    queue = [automaton.initial]
    transitions: list[dict[int, int]] = []
    for state in queue:  # the queue grows while it is read
        row: dict[int, int] = {}
        for token_id, token in enumerate(vocabulary):
            if token is None:
                continue
            target = walk_token(automaton, state, token)
            if target is None:
                continue
            if target not in number:
                number[target] = len(queue)
                queue.append(target)
            row[token_id] = number[target]
        if automaton.is_accepting(state):
            row[eos_token_id] = DONE
        transitions.append(row)
    return TokenIndex(transitions, eos_token_id)
    ### END SOLUTION
