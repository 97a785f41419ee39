# GENERATED from solutions/fast_index.py by `sampling-course make-exercises`.
# Given code: nothing to fill in here; it runs on the exercises of the other files.
# stub-checksum: b3afa1c7ca43e88d32c279ae018842c07c46c07ed5675fbe217b2816d8c4d07c
"""Part 8: the same token index, built at the speed of compiled code. Written for you.

``build_index`` calls ``walk_token`` once per (state, token) pair: for GPT-2's 50,257 tokens
that is 50,257 Python calls per state, each stepping byte by byte, and most of that work is
repeated. Two ideas remove it, and neither changes what the index is:

* **A trie shares work between tokens with a common prefix.** The tokens " the", " them"
  and " theory" all begin with " the": walking the trie of the vocabulary reads those four
  bytes once for all three, and a byte the automaton refuses rules out every token below
  it in one step (after a digit state refuses " ", no token that starts with a space is
  looked at again).
* **Every trie node of a level is stepped at once.** The automaton's moves become a table
  ``moves[state, byte]`` (-1 where the byte is refused), and a level of the walk is one
  numpy gather over all (start state, node) pairs still alive, for a batch of start states.

The index itself is kept as arrays (``IndexRows``): a JSON schema's index holds millions of
(state, token) entries, and a Python dict per row would cost more to build than the walk.
A row becomes a dict when something reads it; the mask table is filled from the arrays.

The states are numbered exactly as ``build_index`` numbers them (breadth-first, in token
order), so the two indexes are equal; a test checks it, and checks both against
outlines-core's index where that library is installed.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np

from .byte_automaton import ByteAutomaton
from .token_index import DONE, TokenIndex

# How many (start state, trie node) pairs one level of the walk may hold: about 16 bytes
# each, so some 100 MB at most; a batch of start states is cut to fit.
MAX_PAIRS = 6_000_000


class TokenTrie:
    """The vocabulary's tokens as a trie of bytes, stored level by level in numpy arrays.

    Nodes are numbered level by level (all nodes of depth 1 first), and the children of a
    node are contiguous: ``child_start[n]`` to ``child_start[n] + child_count[n]``.
    ``byte[n]`` is the byte that leads into node n; the tokens whose bytes end at node n
    are ``ends[end_start[n] : end_start[n] + end_count[n]]`` (token ids; more than one only
    when two tokens have the same bytes). Special tokens (None) and empty tokens are left out:
    they are never read.
    """

    def __init__(self, vocabulary: Sequence[bytes | None]):
        self.size = len(vocabulary)
        ids = sorted((i for i, token in enumerate(vocabulary) if token), key=vocabulary.__getitem__)
        tokens = [vocabulary[i] for i in ids]
        ids_array = np.array(ids, dtype=np.int64)
        lengths = np.array([len(token) for token in tokens], dtype=np.int64)
        width = int(lengths.max()) if tokens else 0
        matrix = np.frombuffer(b"".join(token.ljust(width, b"\0") for token in tokens), dtype=np.uint8).reshape(len(tokens), width)
        # In sorted order, token i shares its first `common[i]` bytes with token i - 1 and
        # brings new nodes for its longer prefixes: one per depth from common[i] + 1 to its length.
        differ = matrix[1:] != matrix[:-1]
        first_difference = np.where(differ.any(axis=1), differ.argmax(axis=1), width) if width else np.zeros(0, dtype=np.int64)
        common = np.concatenate([[0], np.minimum(first_difference, np.minimum(lengths[1:], lengths[:-1]))]).astype(np.int64)

        byte, parent, node_of_token = [], [], np.zeros(len(tokens), dtype=np.int64)
        self.level_start = [0]  # nodes of depth d: level_start[d - 1] to level_start[d]
        candidates, previous = np.arange(len(tokens)), None
        for depth in range(1, width + 1):
            candidates = candidates[lengths[candidates] >= depth]
            new = candidates[common[candidates] < depth]  # the tokens that bring a node of this depth
            start = self.level_start[-1]
            byte.append(matrix[new, depth - 1])
            if previous is None:
                parent.append(np.full(len(new), -1))
            else:  # the node of the nearest token at or before it that brought one a level up
                parent.append(self.level_start[-2] + np.searchsorted(previous, new, side="right") - 1)
            ending = candidates[lengths[candidates] == depth]
            node_of_token[ending] = start + np.searchsorted(new, ending, side="right") - 1
            self.level_start.append(start + len(new))
            previous = new
        self.byte = np.concatenate(byte).astype(np.int64) if byte else np.zeros(0, dtype=np.int64)
        parents = np.concatenate(parent) if parent else np.zeros(0, dtype=np.int64)
        n_nodes = len(self.byte)
        self.child_count = np.bincount(parents[parents >= 0], minlength=n_nodes)
        # The children of a node are contiguous in the next level, which is in the order of its parents.
        children = np.flatnonzero(parents >= 0)
        with_children, first = np.unique(parents[children], return_index=True)
        self.child_start = np.zeros(n_nodes, dtype=np.int64)
        self.child_start[with_children] = children[first]
        order = np.argsort(node_of_token, kind="stable")
        self.ends = ids_array[order]
        self.end_count = np.bincount(node_of_token, minlength=n_nodes)
        self.end_start = np.cumsum(self.end_count) - self.end_count
        # 32-bit copies for the walk, and each node's first token (-1: none ends there).
        self.byte32, self.child_count32 = self.byte.astype(np.int32), self.child_count.astype(np.int32)
        self.child_start32 = self.child_start.astype(np.int32)
        self.end_token = np.full(n_nodes, -1, dtype=np.int32)
        self.end_token[self.end_count > 0] = self.ends[self.end_start[self.end_count > 0]]
        self.has_more_ends = bool((self.end_count > 1).any())  # tokens with the same bytes as another

    @property
    def n_nodes(self) -> int:
        return len(self.byte)


class MoveTable:
    """The automaton's moves as a numpy table, ``table[state * 256 + byte]`` (-1: refused).

    Rows are filled in the order the automaton numbers its states, as the walk reaches them:
    every state below ``filled`` has its row, so one maximum says whether a step needs new rows.
    """

    def __init__(self, automaton: ByteAutomaton):
        self.automaton = automaton
        self.table = np.full(64 * 256, -1, dtype=np.int32)
        self.filled = 0

    def step(self, states: np.ndarray, bytes_: np.ndarray) -> np.ndarray:
        """The next state of each (state, byte) pair, -1 where the byte is refused."""
        if len(states) and int(states.max()) >= self.filled:
            self.fill(int(states.max()) + 1)
        if len(self.table) > 2**31:  # past 8 million states a 32-bit position would overflow
            states = states.astype(np.int64)
        return self.table[states * 256 + bytes_]

    def fill(self, n_states: int) -> None:
        """Rows for every state the automaton has numbered so far, ``n_states`` at least; when the rows
        number more states than the table has room for, it grows and fills theirs too."""
        n_states = max(n_states, self.automaton.n_states)
        if n_states * 256 > len(self.table):
            grown = np.full(max(n_states, 2 * len(self.table) // 256) * 256, -1, dtype=np.int32)
            grown[: len(self.table)] = self.table
            self.table = grown
        for state in range(self.filled, n_states):
            row = self.automaton.row(state)
            self.table[state * 256 : state * 256 + 256] = [-1 if target is None else target for target in row]
        self.filled = n_states
        if self.automaton.n_states * 256 > len(self.table):  # rows that discovered states: room for them
            self.fill(self.filled)


@functools.lru_cache(maxsize=4)
def trie_of(tokens: tuple[bytes | None, ...]) -> TokenTrie:
    return TokenTrie(tokens)


def vocabulary_trie(vocabulary: Sequence[bytes | None]) -> TokenTrie:
    """The trie of ``vocabulary``, built once per vocabulary: a notebook builds many constraints over one."""
    return trie_of(tuple(vocabulary))


def walk_all(trie: TokenTrie, moves: MoveTable, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token read from each automaton state in ``starts``, at once.

    Returns three arrays of equal length, one entry per (start, token) pair that can be read:
    the position of the start in ``starts``, the token id and the automaton state it ends in.
    A level of the trie is a handful of array operations over all (start, node) pairs alive
    at that depth; the arrays are 32-bit, as they are read and written once per level.
    """
    if trie.n_nodes == 0:  # a vocabulary of special tokens only: nothing can be read
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
    width = trie.level_start[1]
    who = np.repeat(np.arange(len(starts), dtype=np.int32), width)
    node = np.tile(np.arange(width, dtype=np.int32), len(starts))
    state = moves.step(np.repeat(starts.astype(np.int32), width), trie.byte32[node])
    found_who, found_token, found_state = [], [], []
    while len(node):
        alive = state >= 0
        who, node, state = who[alive], node[alive], state[alive]
        # The tokens that end here are read (a node ends at most one token but where two tokens have the same bytes).
        token = trie.end_token[node]
        ends = token >= 0
        found_who.append(who[ends])
        found_token.append(token[ends])
        found_state.append(state[ends])
        if trie.has_more_ends:
            for extra in range(1, int(trie.end_count.max())):
                more = trie.end_count[node] > extra
                found_who.append(who[more])
                found_token.append(trie.ends[trie.end_start[node[more]] + extra].astype(np.int32))
                found_state.append(state[more])
        # Step into the children, which are contiguous: child k of a pair's node is child_start + k. A pair
        # whose node has none repeats zero times, which drops it.
        counts = trie.child_count32[node]
        first_of_pair = np.cumsum(counts, dtype=np.int32)
        total = int(first_of_pair[-1]) if len(first_of_pair) else 0
        if not total:
            break
        first_of_pair -= counts
        node = np.repeat(trie.child_start32[node] - first_of_pair, counts)
        node += np.arange(total, dtype=np.int32)
        who, state = np.repeat(who, counts), np.repeat(state, counts)
        state = moves.step(state, trie.byte32[node])
    return np.concatenate(found_who), np.concatenate(found_token), np.concatenate(found_state)


def by_start_and_token(who, token, target, n_starts: int, n_tokens: int, n_states: int):
    """The three arrays sorted by start, then by token id: the order ``build_index`` meets them.

    Where starts and tokens both fit in 16 bits (GPT-2's 50,257 tokens do), two stable sorts of
    16-bit keys, by token and then by start: numpy sorts those by radix, in linear time, some
    twice as fast as the general sort below. Otherwise the three numbers of an entry are packed
    into one 64-bit key and the keys sorted as plain numbers, several times faster than sorting
    by two keys (``np.lexsort``).
    """
    if n_starts <= 2**16 and n_tokens <= 2**16:
        order = np.argsort(token.astype(np.uint16), kind="stable")
        order = order[np.argsort(who[order].astype(np.uint16), kind="stable")]
        return who[order], token[order], target[order]
    if n_starts * n_tokens * n_states >= 2**62:  # too large to pack
        order = np.lexsort((token, who))
        return who[order], token[order], target[order]
    key = np.sort((who.astype(np.int64) * n_tokens + token) * n_states + target)
    rest, target = np.divmod(key, n_states)
    who, token = np.divmod(rest, n_tokens)
    return who, token, target


class IndexRows(Sequence):
    """``TokenIndex.transitions`` kept as three arrays; row s becomes a dict the first time it is read.

    Row s is ``tokens[offsets[s]:offsets[s + 1]]`` with their next states ``targets[...]``, in the
    order ``build_index`` writes them (token ids rising, then the end-of-text token). An index of a
    JSON schema holds millions of entries: as arrays they cost a few bytes each and the mask table
    is filled from them in one operation, where a dict per row costs a Python object per entry,
    most of them never read while decoding.
    """

    def __init__(self, offsets: np.ndarray, tokens: np.ndarray, targets: np.ndarray):
        self.offsets, self.tokens, self.targets = offsets, tokens, targets
        self.rows: list[dict[int, int] | None] = [None] * (len(offsets) - 1)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, state):
        if isinstance(state, slice):
            return [self[s] for s in range(*state.indices(len(self)))]
        row = self.rows[state]  # an IndexError past the last state, and -1 the last, as in a list
        if row is None:
            state = operator.index(state) % len(self.rows)
            lo, hi = self.offsets[state], self.offsets[state + 1]
            row = self.rows[state] = dict(zip(self.tokens[lo:hi].tolist(), self.targets[lo:hi].tolist()))
        return row

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(mine == theirs for mine, theirs in zip(self, other))

    __hash__ = None


def build_index_fast(
    automaton: ByteAutomaton, vocabulary: Sequence[bytes | None] | TokenTrie, eos_token_id: int
) -> TokenIndex:
    """The token index of ``automaton``, equal to ``build_index(automaton, vocabulary, eos_token_id)``.

    ``vocabulary``: token id -> bytes (None for special tokens), or its ``TokenTrie`` when
    several indexes are built over one vocabulary (the trie is the part that depends on the
    vocabulary alone). The index's ``transitions`` is an ``IndexRows``: a list of dicts to read.
    """
    trie = vocabulary if isinstance(vocabulary, TokenTrie) else TokenTrie(vocabulary)
    if not isinstance(eos_token_id, int) or not 0 <= eos_token_id < trie.size:
        raise ValueError(f"eos_token_id must be a token id in [0, {trie.size}), got {eos_token_id!r}")
    moves = MoveTable(automaton)
    number = np.full(64, -1, dtype=np.int64)  # automaton state -> index state
    number[automaton.initial] = 0
    queue = [automaton.initial]
    sizes, tokens, targets = [], [], []  # per batch of start states
    done = 0
    # Start states per batch: as many as the widest level allows within MAX_PAIRS.
    batch = max(1, MAX_PAIRS // max(1, int(np.diff(trie.level_start).max(initial=1))))
    while done < len(queue):
        starts = np.array(queue[done : done + batch], dtype=np.int64)
        done += len(starts)
        who, token, target = walk_all(trie, moves, starts)
        who, token, target = by_start_and_token(who, token, target, len(starts), trie.size, automaton.n_states)
        if len(number) < moves.automaton.n_states:
            number = np.concatenate([number, np.full(moves.automaton.n_states - len(number), -1, dtype=np.int64)])
        # New states are numbered in the order they are first met.
        unseen = target[number[target] < 0]
        fresh, first = np.unique(unseen, return_index=True)
        fresh = fresh[np.argsort(first)]
        number[fresh] = len(queue) + np.arange(len(fresh))
        queue.extend(fresh.tolist())
        target = number[target]
        # In an accepting state the end-of-text token leads to DONE: in place when it is a token that
        # can be read there (its state was numbered above all the same, as build_index does), else last.
        accepting = np.array([automaton.is_accepting(state) for state in starts.tolist()], dtype=bool)
        read_eos = token == eos_token_id
        target[read_eos & accepting[who]] = DONE
        append = accepting.copy()
        append[who[read_eos]] = False
        bounds = np.searchsorted(who, np.arange(len(starts) + 1))
        at = bounds[1:][append]
        tokens.append(np.insert(token, at, eos_token_id))
        targets.append(np.insert(target, at, DONE))
        sizes.append(np.diff(bounds) + append)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(sizes))]).astype(np.int64)
    return TokenIndex(IndexRows(offsets, np.concatenate(tokens), np.concatenate(targets)), eos_token_id)
