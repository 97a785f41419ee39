"""Part 8, JSON mode: ``schema_to_regex`` against ``json``, ``jsonschema`` and Python's ``re``.

How the tests judge: random instances of a schema, written by ``json.dumps``, must match;
random members of the expression (random walks on its automaton) must parse with ``json``
and validate with ``jsonschema``; finite schemas have exactly their texts; and string lengths
count characters as JSON Schema does (code points, a surrogate-pair escape being one),
text by text against ``jsonschema``.

Seeded tests take their seed from ``SAMPLING_COURSE_TEST_SEED`` (default 0); any seed must pass.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re

import pytest
from interegular import parse_pattern
from interegular.fsm import anything_else

from part8_oracles import completed_texts
from sampling_course.grading.lean_imports import import_jsonschema
from sampling_course.implementation import load_demo

jsonschema = import_jsonschema()


@pytest.fixture(scope="module")
def st(impl):
    """The JSON module."""
    return impl.json_schema


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


def validator_of(schema: dict):
    """What ``jsonschema.validate(value, schema)`` validates with, made once: ``validate`` checks the schema itself
    against its metaschema on every call, which cost most of the time of a test that validates hundreds of texts."""
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)

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


def random_members(pattern: str, seed: int, n: int, max_len: int = 80) -> list[str]:
    """``n`` random texts of the pattern's language: random walks on its automaton that head for an accepting state
    (seeded; an oracle function, stored by the ``oracle`` fixture: the same expression gives the same texts)."""
    rng = random.Random(seed)
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
def test_every_member_of_the_expression_is_a_valid_instance(st, seed, oracle):
    """Random members of the expression (random walks on interegular's automaton of it) parse with json, validate
    against the schema, and keep the keys in the schema's order. (The members are stored by the oracle, keyed by
    the expression: a learner who has not changed it meets the same texts, checked here every time.)"""
    pattern = st.schema_to_regex(SCHEMA)
    validator = validator_of(VALIDATOR_SCHEMA)
    for text in oracle(random_members, pattern, seed, 300):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            pytest.fail(f"the expression matches {text!r}, which is not JSON ({exc})", pytrace=False)
        try:
            validator.validate(value)
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
def test_the_story_model_writes_valid_json_for_every_seed(st, story, impl, seed):
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
    out = impl.generate.generate(model, story.tokenizer, prompts, 60, constraint=constraint, seed=seed)
    width = len(story.tokenizer.encode(prompts[0]))
    check = validator_of(validator)
    for tokens, text in completed_texts(constraint, out, width, story.tokenizer.eos_token_id):
        check.validate(json.loads(text))



# Strings as JSON texts, each with its length in characters as JSON Schema counts them (code points of the
# parsed string): escapes, a surrogate pair for one character past U+FFFF, raw characters of 1-4 UTF-8 bytes.
STRING_TEXTS = ['""', '"a"', '"ab"', '"\\n"', '"\\u00e9"', '"é€"', '"😀"', '"\\ud83d\\ude00"', '"\\ud83d\\ude00a"',
                '"\\uD83D\\uDE00"', '"a\\ud83d\\ude00"', '"\\ud83d\\ude00\\ud83d\\ude00"', '"\\ufffd"', '"\\u0041\\""']


@pytest.mark.exercise("schema_to_regex")
@pytest.mark.parametrize("bounds", [(0, None), (1, None), (2, None), (0, 1), (1, 1), (2, 2), (0, 2), (3, 3)])
def test_string_lengths_count_characters_as_json_schema_does(st, bounds):
    """minLength/maxLength count code points of the parsed string, so the surrogate-pair escape
    "\\ud83d\\ude00" is one character: {"type": "string", "minLength": 2} rejects it, as jsonschema does."""
    low, high = bounds
    schema = {"type": "string", "minLength": low} | ({} if high is None else {"maxLength": high})
    pattern = st.schema_to_regex(schema)
    for text in STRING_TEXTS:
        expected = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert (re.fullmatch(pattern, text) is not None) == expected, (
            f"{schema} on {text}: jsonschema says {'valid' if expected else 'invalid'} ({len(json.loads(text))} characters)"
        )


@pytest.mark.exercise("schema_to_regex")
def test_lone_surrogate_escapes_are_refused(st):
    """The course's convention where jsonschema differs: a lone surrogate escape stands for no character (Python's
    json reads it into a string holding a lone surrogate, which jsonschema counts as one character); the
    expression refuses it, alone or in the wrong order."""
    pattern = st.schema_to_regex({"type": "string"})
    for text in ['"\\ud83d"', '"\\ude00"', '"\\ude00\\ud83d"', '"\\ud83da"']:
        assert jsonschema.Draft202012Validator({"type": "string"}).is_valid(json.loads(text))  # what we differ from
        assert re.fullmatch(pattern, text) is None, f"{text}: a lone surrogate escape must be refused"
