# GENERATED from solutions/structured.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: ff37915c80716fa93a57554e6d39a0e1c702ff3b2f3242f785b11042b75e4467
"""Part 8: structured generation, and what it does to the model's distribution.

"Answer in JSON", "a date as YYYY-MM-DD", "one of these five labels": production engines
(vLLM's guided decoding, llama.cpp's grammars, outlines, xgrammar) guarantee such formats
by *constrained decoding*. At every step, the tokens that would break the format get a
logit of -inf, and the model samples from what is left:

    regular expression -> automaton over characters (the interegular library)
                       -> automaton over bytes (``ByteAutomaton``, written for you)
                       -> token index: for each state, the tokens that may follow and
                          where each leads (``walk_token``, ``build_index``)
                       -> per step: mask the logits of each row's state, sample, advance
                          each row's state (``TokenConstraint``, part 5's ``generate``)

Tokens are byte strings. GPT-2's vocabulary is byte-level: a token may hold half of a
multi-byte character ("é" is two bytes, and a token can end after the first), so the
automaton must read bytes, and a state may sit in the middle of a character.

Masking is not conditioning. Sampling with the mask gives every member x of the language
L the probability q(x), the product of the *renormalised* conditionals along the way; the
model's own distribution restricted to L is p(x | x in L), proportional to the product of
the unrenormalised ones. The two differ whenever a prefix that looks likely to the model
leads mostly to text outside L: renormalisation pours that lost mass into the few allowed
continuations. For a finite language both laws can be computed exactly, member by member
(``enumerate_language``, ``exact_laws``), and so can the distance between them
(``kl_divergence``).

A JSON-schema subset compiles to a regular expression (``schema_to_regex``), so JSON mode
is the same machinery.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import interegular
import torch
from interegular.fsm import anything_else
from jaxtyping import Bool, Float, Int
from torch import Tensor

# The state of a row that has read the end-of-text token: finished, and only EOS may follow.
DONE = -1

# ---------------------------------------------------------------------------------------
# From a regular expression to an automaton over bytes (written for you)
# ---------------------------------------------------------------------------------------

# The code points a UTF-8 sequence of n bytes may encode (shorter encodings are invalid).
_UTF8_RANGES = {2: (0x80, 0x7FF), 3: (0x800, 0xFFFF), 4: (0x10000, 0x10FFFF)}
_SURROGATES = (0xD800, 0xDFFF)


def utf8_length(lead: int) -> int | None:
    """How many bytes the character that starts with byte ``lead`` has (None: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return None


def code_point_range(prefix: bytes) -> tuple[int, int] | None:
    """The code points whose UTF-8 encoding starts with ``prefix`` (1 to 4 bytes), as an interval.

    UTF-8 keeps the order of code points, so they form one interval [lo, hi]; None when no
    valid character starts so. Surrogates (U+D800-U+DFFF) inside the interval are not
    characters; ``valid_count`` leaves them out.
    """
    n = utf8_length(prefix[0])
    if n is None or len(prefix) > n or any(not 0x80 <= b <= 0xBF for b in prefix[1:]):
        return None
    value = prefix[0] & (0x7F, 0x1F, 0x0F, 0x07)[n - 1]
    for b in prefix[1:]:
        value = value << 6 | (b & 0x3F)
    missing_bits = 6 * (n - len(prefix))
    lo, hi = value << missing_bits, (value << missing_bits) | ((1 << missing_bits) - 1)
    if n > 1:
        lo, hi = max(lo, _UTF8_RANGES[n][0]), min(hi, _UTF8_RANGES[n][1])
    if lo > hi or valid_count(lo, hi) == 0:
        return None
    return lo, hi


def first_continuation(prefix: bytes) -> tuple[int, int]:
    """The bytes that may come right after ``prefix`` (an unfinished character), as a range.

    After the lead byte, four leads narrow it (no overlong encodings, no surrogates, nothing
    past U+10FFFF); every later continuation byte is 0x80-0xBF.
    """
    if len(prefix) == 1:
        return {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(prefix[0], (0x80, 0xBF))
    return 0x80, 0xBF


def valid_count(lo: int, hi: int) -> int:
    """How many characters (code points that are not surrogates) lie in [lo, hi]."""
    overlap = max(0, min(hi, _SURROGATES[1]) - max(lo, _SURROGATES[0]) + 1)
    return hi - lo + 1 - overlap


class ByteAutomaton:
    """A regular expression as a deterministic automaton over bytes.

    interegular compiles the expression into an automaton over *characters*. This class
    reads UTF-8 bytes instead: an ASCII byte is a character of its own; the bytes of a
    multi-byte character are collected until the character is complete, and in between
    the automaton sits in a state "character state + pending bytes". Every state is
    *live*: ``step`` never enters a state from which no accepting state can be reached,
    so a text that reaches a state can always be completed into a member of the language.

    ``initial`` is the start state; ``step(state, byte)`` is the next state or None (the
    byte cannot come next); ``is_accepting(state)`` says whether the text read so far is a
    member. States are small integers, numbered as they are discovered.
    """

    def __init__(self, pattern: str):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a regular expression as a str, got {type(pattern).__name__}")
        try:
            fsm = interegular.parse_pattern(pattern).to_fsm()
        except Exception as exc:  # interegular raises several kinds for unsupported syntax
            raise ValueError(f"cannot compile the regular expression {pattern!r}: {exc}") from None
        self.pattern = pattern
        self.fsm = fsm
        self.live = self._live_states(fsm)
        if fsm.initial not in self.live:
            raise ValueError(f"the regular expression {pattern!r} matches no text at all")
        self._symbol = fsm.alphabet  # character -> symbol (anything_else for unlisted characters)
        self._anything_else = fsm.alphabet[anything_else]
        # The characters interegular lists explicitly, as sorted code points with their symbols.
        listed = sorted((ord(c), s) for c, s in fsm.alphabet.items() if c is not anything_else)
        self._listed_points = [point for point, _ in listed]
        self._listed_symbols = [symbol for _, symbol in listed]
        self._states: list[tuple[int, bytes]] = []  # number -> (character state, pending bytes)
        self._numbers: dict[tuple[int, bytes], int] = {}
        self._rows: list[list[int | None] | None] = []  # number -> next state for each of the 256 bytes
        self.initial = self._number((fsm.initial, b""))

    @staticmethod
    def _live_states(fsm) -> set:
        """The character states from which an accepting state can be reached."""
        parents = defaultdict(set)
        for state, moves in fsm.map.items():
            for target in moves.values():
                parents[target].add(state)
        live, todo = set(fsm.finals), list(fsm.finals)
        while todo:
            for parent in parents[todo.pop()]:
                if parent not in live:
                    live.add(parent)
                    todo.append(parent)
        return live

    def _number(self, state: tuple[int, bytes], key=None) -> int:
        """The number of the state (character state, pending bytes); states with the same ``key`` share one."""
        key = state if key is None else key
        if key not in self._numbers:
            self._numbers[key] = len(self._states)
            self._states.append(state)
            self._rows.append(None)
        return self._numbers[key]

    @property
    def n_states(self) -> int:
        """States discovered so far (the automaton grows as texts are read)."""
        return len(self._states)

    def is_accepting(self, state: int) -> bool:
        char_state, pending = self._states[state]
        return not pending and char_state in self.fsm.finals

    def step(self, state: int, byte: int) -> int | None:
        row = self._rows[state]
        if row is None:  # computed once per state, for all 256 bytes
            char_state, pending = self._states[state]
            row = [self._next(char_state, pending + bytes([b])) for b in range(256)]
            self._rows[state] = row
        return row[byte]

    def _char_step(self, char_state: int, char: str):
        target = self.fsm.map[char_state].get(self._symbol[char])
        return target if target in self.live else None

    def _next(self, char_state: int, pending: bytes) -> int | None:
        span = code_point_range(pending)
        if span is None:
            return None
        lo, hi = span
        if len(pending) == utf8_length(pending[0]):  # a complete character
            target = self._char_step(char_state, chr(lo))
            return None if target is None else self._number((target, b""))
        # Part of a character: go on only if some character that starts so can be read here.
        moves = {symbol for symbol, target in self.fsm.map[char_state].items() if target in self.live}
        start, stop = bisect.bisect_left(self._listed_points, lo), bisect.bisect_right(self._listed_points, hi)
        if not any(self._listed_symbols[i] in moves for i in range(start, stop)):
            # Characters interegular does not list all take the `anything_else` move.
            if self._anything_else not in moves or valid_count(lo, hi) == stop - start:
                return None
        if start == stop:
            # No listed character starts so: every completion takes the same move, so all such
            # prefixes with the same number of bytes to go (and the same range for the next
            # byte) are one state. Without this, a vocabulary of single bytes would reach one
            # state per prefix of every character: some 20,000 per character state.
            key = (char_state, "any", utf8_length(pending[0]) - len(pending), first_continuation(pending))
            return self._number((char_state, pending), key)
        return self._number((char_state, pending))


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
    # Hint: build the byte -> character table of GPT-2 first, then read every token through its inverse.
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# The token index
# ---------------------------------------------------------------------------------------


def walk_token(automaton: ByteAutomaton, state: int, token: bytes) -> int | None:
    """The state after reading all of ``token``'s bytes from ``state``, or None if any byte is refused.

    A token may be read only if *every* byte of it keeps the text inside the language:
    the automaton must accept each byte in turn. (An empty token reads nothing: None.)
    """
    if not token:
        return None
    # Hint: one step per byte, and a single refused byte rules out the whole token.
    raise NotImplementedError()


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
    # Hint: a queue of automaton states and a dict automaton state -> index state; a state's row is done when it leaves the queue.
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# A constraint for part 5's generate
# ---------------------------------------------------------------------------------------


class TokenConstraint:
    """Each row of a batch in one state of a ``TokenIndex``; masks the logits and follows the tokens.

    Part 5's ``generate(..., constraint=...)`` uses it like this, once per step::

        states = constraint.start(batch)                  # before the loop: every row at state 0
        logits = constraint.mask_logits(logits, states)   # before temperature and filters
        tokens = sample(logits, ...)
        states = constraint.advance(states, tokens)
        finished |= constraint.finished(states)           # a row that read EOS is done

    ``allowed`` is a boolean table with one row per index state and a last row for
    ``DONE`` (so ``allowed[states]`` works for every state, DONE = -1 included): True
    where a token may follow. In DONE only the end-of-text token may follow, so a finished
    row still has something to sample (part 5 replaces it with a pad anyway).
    """

    DONE = DONE

    def __init__(self, index: TokenIndex, vocabulary: Sequence[bytes | None], d_vocab: int | None = None):
        d_vocab = len(vocabulary) if d_vocab is None else d_vocab
        if d_vocab < len(vocabulary):
            raise ValueError(f"d_vocab={d_vocab} is smaller than the vocabulary ({len(vocabulary)} tokens)")
        self.index = index
        self.vocabulary = list(vocabulary)
        self.d_vocab = d_vocab
        allowed = torch.zeros(index.n_states + 1, d_vocab, dtype=torch.bool)
        for state, row in enumerate(index.transitions):
            allowed[state, list(row)] = True
        allowed[DONE, index.eos_token_id] = True
        self.allowed = allowed

    @property
    def eos_token_id(self) -> int:
        return self.index.eos_token_id

    def start(self, batch: int, device: torch.device | str | None = None) -> Int[Tensor, "batch"]:
        """Every row at the start state (0)."""
        return torch.zeros(batch, dtype=torch.long, device=device)

    def mask_logits(self, logits: Float[Tensor, "batch d_vocab"], states: Int[Tensor, "batch"]) -> Float[Tensor, "batch d_vocab"]:
        """``logits`` with every token that may not follow its row's state set to -inf; the rest unchanged."""
        check_rows(logits, states, self.d_vocab)
        allowed = self.allowed.to(logits.device)
        # Hint: allowed[states] is one row of the table per row of the batch.
        raise NotImplementedError()

    def advance(self, states: Int[Tensor, "batch"], tokens: Int[Tensor, "batch"]) -> Int[Tensor, "batch"]:
        """Each row's state after reading its token.

        A row follows ``index.transitions``; reading the end-of-text token takes it to
        DONE. A row already in DONE stays there, whatever it reads (a finished row reads
        pads). A token that may not follow its row's state raises a ValueError.
        """
        if states.shape != tokens.shape or states.ndim != 1:
            raise ValueError(f"states and tokens must both have shape (batch,), got {tuple(states.shape)} and {tuple(tokens.shape)}")
        # Hint: a Python loop over the rows is fine: the index is a list of dicts.
        raise NotImplementedError()

    def finished(self, states: Int[Tensor, "batch"]) -> Bool[Tensor, "batch"]:
        """The rows that have read the end-of-text token."""
        return states == DONE

    def text(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (the end-of-text token and anything after it left out)."""
        token_ids = list(token_ids)
        if self.eos_token_id in token_ids:
            token_ids = token_ids[: token_ids.index(self.eos_token_id)]
        return b"".join(self.vocabulary[t] or b"" for t in token_ids).decode("utf-8", errors="replace")


def regex_constraint(pattern: str, tokenizer, d_vocab: int | None = None) -> TokenConstraint:
    """A ``TokenConstraint`` for the regular expression ``pattern`` over ``tokenizer``'s vocabulary.

    Every text ``generate(..., constraint=...)`` completes (ends with the end-of-text
    token) matches ``pattern`` as a whole (Python's ``re.fullmatch``). ``d_vocab``: the
    model's vocabulary size when it is larger than the tokenizer's.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no eos_token_id: a constraint needs an end-of-text token to finish a text")
    vocabulary = token_bytes(tokenizer)
    index = build_index(ByteAutomaton(pattern), vocabulary, eos)
    return TokenConstraint(index, vocabulary, d_vocab)


# ---------------------------------------------------------------------------------------
# JSON: a schema subset as a regular expression
# ---------------------------------------------------------------------------------------

# One character inside a JSON string: anything but a quote, a backslash or a control
# character, or an escape.
JSON_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
JSON_INTEGER = r"-?(?:0|[1-9][0-9]*)"

SCHEMA_KEYS = {
    "object": {"type", "properties", "required"},
    "string": {"type", "minLength", "maxLength"},
    "integer": {"type"},
    "boolean": {"type"},
    "array": {"type", "items", "minItems", "maxItems"},
}


def schema_to_regex(schema: dict) -> str:
    """A regular expression that matches exactly the JSON texts of ``schema``, laid out as ``json.dumps`` does.

    The subset: ``{"type": "object", "properties": {...}}`` (every key present, in the
    order given; "required", if present, must list them all), ``{"type": "string"}``
    (optionally ``minLength``/``maxLength``), ``{"type": "integer"}``,
    ``{"type": "boolean"}``, ``{"enum": [...]}`` (any JSON values) and
    ``{"type": "array", "items": {...}}`` (optionally ``minItems``/``maxItems``).
    Layout: ``{"key": value, "key2": value}`` and ``[1, 2]``, with ", " and ": " as
    separators, as ``json.dumps(value, ensure_ascii=False)`` writes it.
    """
    check_schema(schema)
    # Hint: one case per kind of schema, calling itself for properties and items; re.escape every literal.
    raise NotImplementedError()


def json_schema_constraint(schema: dict, tokenizer, d_vocab: int | None = None) -> TokenConstraint:
    """A ``TokenConstraint`` whose completed texts are the JSON texts of ``schema`` (see ``schema_to_regex``)."""
    return regex_constraint(schema_to_regex(schema), tokenizer, d_vocab)


# ---------------------------------------------------------------------------------------
# The distortion, exactly
# ---------------------------------------------------------------------------------------


@dataclass
class LanguagePath:
    """One way the constrained sampler can spell a member: its tokens and, at each step, two numbers.

    ``logprobs[i]``: the model's log-probability of ``tokens[i]`` after the prompt and the
    tokens before it. ``allowed_logmass[i]``: the log of the model's total probability of
    the tokens the constraint allowed at that step (so ``logprobs[i] - allowed_logmass[i]``
    is the log-probability that mask-and-renormalise gives ``tokens[i]``).
    """

    tokens: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    allowed_logmass: tuple[float, ...]


@dataclass
class Language:
    """Every path of a finite language that ``enumerate_language`` explored, and what it left out.

    ``skipped_q_mass`` bounds the probability that mask-and-renormalise ends in a path
    not listed; ``skipped_p_mass`` bounds the model's probability of the unlisted paths.
    Both are 0 when nothing was skipped. ``forward_rows``: the sequences the model ran.
    """

    paths: list[LanguagePath]
    skipped_q_mass: float = 0.0
    skipped_p_mass: float = 0.0
    forward_rows: int = 0
    members: set[str] = field(default_factory=set)

    @property
    def p_language(self) -> float:
        """The model's probability that its continuation begins with (a spelling of) a member."""
        return sum(math.exp(sum(path.logprobs)) for path in self.paths)


class NextTokenScorer:
    """The model's next-token log-probabilities after ``prompt_ids`` + each of many token suffixes.

    A DemoTransformer runs the prompt once and keeps its KV cache (part 4); each batch of
    suffixes then runs on a copy of that cache, so only the suffixes' positions cost
    anything. Any other model (a Hugging Face one, say) runs prompt and suffix in full.
    """

    def __init__(self, model, prompt_ids: list[int]):
        self.model, self.prompt_ids, self.rows = model, list(prompt_ids), 0
        param = next(model.parameters(), None) if hasattr(model, "parameters") else None
        self.device = param.device if param is not None else torch.device("cpu")
        self.prompt_cache = None
        cache_class = getattr(sys.modules.get(type(model).__module__), "KeyValueCache", None)
        if cache_class is not None and hasattr(model, "cfg"):
            with torch.inference_mode():
                empty = cache_class.new_empty(model.cfg, 1, self.device, param.dtype if param is not None else torch.float32)
                _, self.prompt_cache = model(torch.tensor([self.prompt_ids], device=self.device), empty)

    def __call__(self, suffixes: list[tuple[int, ...]]) -> Float[Tensor, "batch d_vocab"]:
        """One row of float64 log-probabilities per suffix; the suffixes must all have one length."""
        self.rows += len(suffixes)
        tokens = torch.tensor([self.prompt_ids + list(suffix) for suffix in suffixes], device=self.device)
        with torch.inference_mode():
            if self.prompt_cache is None or not suffixes[0]:
                logits = self.model(tokens)
                logits = getattr(logits, "logits", logits)  # a Hugging Face model returns an output object
            else:
                cache = self.prompt_cache.as_subclass(Tensor).expand(-1, -1, len(suffixes), -1, -1, -1)
                logits, _ = self.model(tokens, type(self.prompt_cache)(cache))
        return logits[:, -1].double().log_softmax(dim=-1).cpu()


def enumerate_language(
    model,
    tokenizer,
    prompt: str,
    constraint: TokenConstraint,
    *,
    skip_below: float = 1e-9,
    batch_size: int = 256,
    max_tokens: int = 64,
) -> Language:
    """Every token path of the constraint's (finite) language after ``prompt``, with the model's numbers.

    A member is complete when the constraint reaches a state where only the end-of-text
    token may follow: the constrained sampler's EOS is then forced, so neither law needs
    the model's own EOS probability. The language must therefore be *prefix-free* (no
    member is the beginning of another; end the pattern with a delimiter such as "."):
    then "the model's tokens begin with a spelling of x" are disjoint events, one per x,
    and the model's p(x | x in L) is their probability renormalised.

    The search is breadth-first, one batched forward pass per group of paths of the same
    length. A path whose masked probability and whose model probability (relative to a
    member found first by following the most likely allowed token) are both below
    ``skip_below`` is not explored further; the masses skipped are reported.
    """
    index = constraint.index
    prompt_ids = list(tokenizer.encode(prompt))
    if not prompt_ids:
        raise ValueError("the prompt must encode to at least one token")
    eos = index.eos_token_id
    language = Language(paths=[])
    scorer = NextTokenScorer(model, prompt_ids)

    def step(rows):
        return scorer([row[0] for row in rows])

    # A lower bound on the model's probability of the language: one member, greedily.
    state, tokens, logp = 0, (), 0.0
    while True:
        allowed = [t for t in index.transitions[state] if t != eos]
        if not allowed:
            break
        if len(tokens) >= max_tokens:
            raise ValueError(f"a member is longer than max_tokens={max_tokens}: is the language finite?")
        logprobs = step([(tokens,)])[0]
        best = max(allowed, key=lambda t: logprobs[t].item())
        state, tokens, logp = index.transitions[state][best], tokens + (best,), logp + logprobs[best].item()
    floor_q, floor_p = math.log(skip_below), math.log(skip_below) + logp

    # (tokens, state, logprobs so far, allowed log-masses so far)
    frontier = [((), 0, (), ())]
    while frontier:
        if len(frontier[0][0]) > max_tokens:
            raise ValueError(f"paths longer than max_tokens={max_tokens}: the language must be finite")
        next_frontier = []
        for start in range(0, len(frontier), batch_size):
            rows = frontier[start : start + batch_size]
            logprobs = step(rows)
            for (tokens, state, lps, masses), row_logprobs in zip(rows, logprobs):
                moves = index.transitions[state]
                ids = torch.tensor(list(moves))
                mass = torch.logsumexp(row_logprobs[ids], dim=0).item()
                for token, target in moves.items():
                    if token == eos:
                        raise ValueError(
                            "the language is not prefix-free: a member can be followed by more text. "
                            "End the pattern with a delimiter (such as a full stop) that no member contains"
                        )
                    path = (tokens + (token,), target, lps + (row_logprobs[token].item(),), masses + (mass,))
                    if set(index.transitions[target]) == {eos}:  # complete: only EOS may follow
                        text = constraint.text(path[0])
                        language.paths.append(LanguagePath(path[0], text, path[2], path[3]))
                        language.members.add(text)
                        continue
                    log_p, log_q = sum(path[2]), sum(path[2]) - sum(path[3])
                    if log_q < floor_q and log_p < floor_p:
                        language.skipped_q_mass += math.exp(log_q)
                        language.skipped_p_mass += math.exp(log_p)
                        continue
                    next_frontier.append(path)
        frontier = next_frontier
    language.forward_rows = scorer.rows
    return language


def exact_laws(paths: Sequence[LanguagePath]) -> tuple[dict[str, float], dict[str, float]]:
    """The two laws over the members: the model's p(x | x in L) and mask-and-renormalise's q(x).

    A path's model probability is the product of its tokens' probabilities; its masked
    probability the product of each token's probability divided by the allowed mass at
    that step. A member spelled by several paths (different tokenizations of the same
    text) is one outcome: its probability is the sum over its paths. p is normalised to
    sum to 1 over the members; q is returned as it is (it sums to 1 when every path is
    listed). Returns two dicts text -> probability, with the same keys.
    """
    # Hint: add the paths of one text in log space (logsumexp), and normalise p by the total over all texts.
    raise NotImplementedError()


def kl_divergence(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(p || q) = sum over x of p(x) log(p(x) / q(x)), in nats.

    Outcomes with p(x) = 0 add nothing; an outcome with p(x) > 0 and q(x) = 0 (or missing
    from q) makes it infinite.
    """
    # Hint: natural logarithms; skip the terms where p(x) is 0, since p log p -> 0.
    raise NotImplementedError()


def most_distorted(p: dict[str, float], q: dict[str, float], k: int = 5) -> list[tuple[str, float, float, float]]:
    """The ``k`` members whose masked probability is farthest from the model's, largest |log(q/p)| first.

    Each entry: (text, p(x | L), q(x), q / p).
    """
    rows = [(x, p[x], q.get(x, 0.0), q.get(x, 0.0) / p[x] if p[x] > 0 else math.inf) for x in p]
    return sorted(rows, key=lambda row: -abs(math.log(row[3])) if 0 < row[3] < math.inf else -math.inf)[:k]


def sample_by_enumeration(p: dict[str, float], n: int, generator: torch.Generator | None = None) -> list[str]:
    """``n`` members drawn from ``p`` (for example the model's exact p(x | x in L) from ``exact_laws``)."""
    texts = list(p)
    probs = torch.tensor([p[t] for t in texts], dtype=torch.float64)
    draws = torch.multinomial(probs, n, replacement=True, generator=generator)
    return [texts[i] for i in draws.tolist()]


def rejection_sample(
    model, tokenizer, prompt: str, pattern: str, n: int, max_new_tokens: int, *, batch_size: int = 64,
    max_tries: int = 100_000, seed: int = 0,
) -> tuple[list[str], int]:
    """Exact samples of p(x | x in L): sample freely, keep the samples whose tokens begin with a member.

    Each attempt is one unconstrained continuation of ``max_new_tokens`` tokens (part 5's
    ``generate``, temperature 1); it is accepted when some prefix of its tokens spells a
    member of ``pattern``'s (prefix-free) language, and that member is the sample. An
    attempt succeeds with probability p(L), so a sample costs 1 / p(L) attempts on
    average. Returns the samples found (at most ``n``) and the number of attempts made
    (stops after ``max_tries``).
    """
    from .generate import generate

    vocabulary = token_bytes(tokenizer)
    compiled = re.compile(pattern)
    samples: list[str] = []
    tries = 0
    while len(samples) < n and tries < max_tries:
        rows = min(batch_size, max_tries - tries)
        out = generate(model, tokenizer, [prompt] * rows, max_new_tokens, seed=seed + tries, eos_token_id=-1)
        tries += rows
        for row in out[:, -max_new_tokens:].tolist():
            text = b""
            for token in row:
                if vocabulary[token] is None:  # the end-of-text token (or another special one) ends the text
                    break
                text += vocabulary[token]
                try:
                    decoded = text.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if compiled.fullmatch(decoded):
                    samples.append(decoded)
                    break
    return samples[:n], tries


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


def check_rows(logits: Tensor, states: Tensor, d_vocab: int) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[-1] != d_vocab:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape (batch, d_vocab={d_vocab}), got {shape}")
    if not isinstance(states, Tensor) or states.shape != logits.shape[:1] or states.is_floating_point():
        raise ValueError(f"states must be an integer tensor of shape (batch={logits.shape[0]},), got {states!r:.80}")


def check_schema(schema) -> None:
    if not isinstance(schema, dict):
        raise TypeError(f"a schema is a dict, got {type(schema).__name__}")
    if "enum" in schema:
        if set(schema) - {"enum", "type"} or not isinstance(schema["enum"], list) or not schema["enum"]:
            raise ValueError(f"an enum schema is {{'enum': [value, ...]}} with at least one value, got {schema!r}")
        return
    kind = schema.get("type")
    if kind not in SCHEMA_KEYS:
        raise ValueError(f"schema type must be one of {sorted(SCHEMA_KEYS)} (or an 'enum'), got {kind!r} in {schema!r}")
    extra = set(schema) - SCHEMA_KEYS[kind]
    if extra:
        raise ValueError(f"unsupported keys {sorted(extra)} in a {kind!r} schema; allowed: {sorted(SCHEMA_KEYS[kind])}")
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        if key in schema and (isinstance(schema[key], bool) or not isinstance(schema[key], int) or schema[key] < 0):
            raise ValueError(f"{key} must be an integer >= 0, got {schema[key]!r}")
    low, high = schema.get("minLength", schema.get("minItems", 0)), schema.get("maxLength", schema.get("maxItems"))
    if high is not None and low > high:
        raise ValueError(f"the minimum ({low}) is larger than the maximum ({high}) in {schema!r}")
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise ValueError(f"an object schema needs 'properties': a non-empty dict of key -> schema, got {properties!r}")
        if "required" in schema and sorted(schema["required"]) != sorted(properties):
            raise ValueError(f"every key is required in this subset: 'required' must list all of {list(properties)}")
    if kind == "array" and not isinstance(schema.get("items"), dict):
        raise ValueError(f"an array schema needs 'items': the schema of its items, got {schema.get('items')!r}")
