"""Part 8's probes: the offline tiny tokenizer's bytes, small byte vocabularies and patterns for the
automaton walks and the index, a hand-written index for the constraint, a toy cached language
model for constrained generation, fixed texts for the JSON expressions, and hand-made paths and
laws for the distortion.

Constrained generation is probed deterministically: greedy decoding, and top-k = 1 at
temperature 1 (one token survives the filters, so the draw has one outcome).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from sampling_course.grading.matching import attempt, plain
from sampling_course.grading.probing import CachedToyLM, Impl, generator, probe, small_config, tokenizer, word_ids, word_table

# Byte tokens: whole words, single bytes, and the halves of "é" (c3 a9) and "€" (e2 82 ac).
VOCAB = [b"a", b"b", b"c", b"ab", b"ba", b"abc", b" ", b"\xc3", b"\xa9", b"\xc3\xa9", b"\xe2\x82", b"\xac", b"\xac!",
         b"1", b"12", b"x", None]
EOS = len(VOCAB) - 1
PATTERN = r"(ab|ba)+c?|é€!|1[0-9]?"


@probe("token_bytes")
def _probe_token_bytes(impl: Impl) -> Any:
    tok = tokenizer()
    # The end-of-text token, words with spaces, a tab and a newline, and characters split over
    # tokens (é is c3 a9, € is e2 82 ac: 0x82 is one of the bytes GPT-2 shifts).
    ids = [tok.eos_token_id] + tok.encode(" the café costs 5 € now\n\tok")
    return attempt(lambda: [impl.token_index.token_bytes(tok)[i] for i in ids])


@probe("walk_token")
def _probe_walk_token(impl: Impl) -> Any:
    automaton = impl.byte_automaton.ByteAutomaton(PATTERN)
    after_e = automaton.step(automaton.step(automaton.initial, 0xC3), 0xA9)  # after "é"
    starts = [automaton.initial, automaton.step(automaton.initial, ord("a")), after_e]
    return [[attempt(lambda s=s, t=t: impl.token_index.walk_token(automaton, s, t)) for t in VOCAB[:-1]] for s in starts]


@probe("build_index")
def _probe_build_index(impl: Impl) -> Any:
    def index() -> Any:
        built = impl.token_index.build_index(impl.byte_automaton.ByteAutomaton(PATTERN), VOCAB, EOS)
        return [sorted(row.items()) for row in built.transitions]

    return attempt(index)


def _hand_constraint(impl: Impl) -> Any:
    # Tokens a, b, c, EOS, and a fifth a pad may be. State 0: a -> 1, c -> 1; state 1: b -> 0, EOS -> DONE.
    index = impl.token_index.TokenIndex([{0: 1, 2: 1}, {1: 0, 3: -1}], eos_token_id=3)
    return impl.token_constraint.TokenConstraint(index, [b"a", b"b", b"c", None], d_vocab=5)


@probe("TokenConstraint")
def _probe_token_constraint(impl: Impl) -> Any:
    constraint = _hand_constraint(impl)
    logits = torch.randn(4, 5, generator=generator(120))

    def masked() -> Any:
        # As probabilities: a -inf mask and a -1e10 one give the same.
        return plain(constraint.mask_logits(logits.clone(), torch.tensor([0, 1, -1, 0])).softmax(-1))

    def advanced(states: list[int], tokens: list[int]) -> Any:
        return constraint.advance(torch.tensor(states), torch.tensor(tokens)).tolist()

    return [
        attempt(masked),
        attempt(lambda: advanced([0, 1, 1, 0], [0, 1, 3, 2])),  # a, b, EOS (to DONE), c
        attempt(lambda: advanced([-1, -1], [3, 4])),  # finished rows read pads
        attempt(lambda: advanced([0], [1])),  # b may not follow state 0
    ]


@probe("constrained_generate")
def _probe_constrained_generate(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    eos = tok.eos_token_id
    g = generator(121)
    table, row_of = word_table(g)
    model = CachedToyLM(small_config(d_vocab=len(tok), n_ctx=32), table, row_of)
    prompt = tok.decode(words[:2])
    # The model's favourite word after the prompt is not allowed: top-k = 1 on the unmasked
    # logits would keep a token the mask then removes.
    favourite = int(table[row_of[words[1]]].argmax())
    allowed = [w for w in words[:8] if w != favourite][:4]
    # Any two allowed words, then EOS: three states and DONE.
    transitions = [{w: 1 for w in allowed}, {w: 2 for w in allowed}, {eos: -1}]
    index = impl.token_index.TokenIndex(transitions, eos_token_id=eos)
    vocabulary = [None] * len(tok)

    def run(**settings: Any) -> Any:
        constraint = impl.token_constraint.TokenConstraint(index, vocabulary, d_vocab=len(tok))
        return plain(impl.generate.generate(model, tok, [prompt, tok.decode(words[2:3])], 6, constraint=constraint, **settings))

    return [
        attempt(lambda: run(temperature=0.0)),
        attempt(lambda: run(temperature=0.0, eos_token_id=-1)),  # the constraint alone ends the rows
        attempt(lambda: run(temperature=1.0, top_k=1, seed=0)),
    ]


@probe("schema_to_regex")
def _probe_schema_to_regex(impl: Impl) -> Any:
    schema = {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 3}, "n": {"type": "integer"}, "e": {"enum": ["a.b*", 2, None]},
        "l": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}
    texts = [
        '{"s": "ab", "n": 7, "e": "a.b*", "l": []}',
        '{"s": "", "n": -10, "e": 2, "l": [true, false]}',
        '{"s": "a\\"b", "n": 0, "e": null, "l": [false]}',
        '{"s": "abcd", "n": 7, "e": "a.b*", "l": []}',  # too long
        '{"s": "a\\", "n": 7, "e": "a.b*", "l": []}',  # a bare backslash
        '{"s": "ab", "n": 007, "e": "a.b*", "l": []}',  # leading zeros
        '{"s": "ab", "n": 7, "e": "aXbbb", "l": []}',  # not the enum value
        '{"s": "ab", "n": 7, "e": 2, "l": [true, true, true]}',  # too many items
        '{"s": "ab", "n": 7, "e": 2, "l": [true,false]}',  # layout
        '{"n": 7, "s": "ab", "e": 2, "l": []}',  # key order
    ]

    def verdicts() -> Any:
        pattern = impl.json_schema.schema_to_regex(schema)
        return [re.fullmatch(pattern, text) is not None for text in texts]

    return attempt(verdicts)


@probe("exact_laws")
def _probe_exact_laws(impl: Impl) -> Any:
    import math

    def path(tokens: list[int], text: str, probs: list[float], masses: list[float]) -> Any:
        return impl.distortion.LanguagePath(tuple(tokens), text, tuple(map(math.log, probs)), tuple(map(math.log, masses)))

    paths = [path([0, 1], "ab", [0.2, 0.5], [0.4, 0.5]), path([2], "ab", [0.1], [0.4]), path([3], "c", [0.05], [0.4]),
             path([4, 5], "d", [0.02, 0.1], [0.4, 0.2])]
    return attempt(lambda: impl.distortion.exact_laws(paths))


@probe("kl_divergence")
def _probe_kl_divergence(impl: Impl) -> Any:
    kl = impl.distortion.kl_divergence
    p = {"a": 0.7, "b": 0.2, "c": 0.1}
    q = {"a": 0.3, "b": 0.3, "c": 0.4}
    return [attempt(lambda: kl(p, q)), attempt(lambda: kl({"a": 0.5, "b": 0.5, "c": 0.0}, q)), attempt(lambda: kl(q, {"a": 1.0}))]
