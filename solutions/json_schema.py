"""Part 8: JSON mode. A JSON-schema subset compiles to a regular expression, so it is the same machinery.

What a character is, for ``minLength`` and ``maxLength``: JSON Schema counts the characters
of the string the JSON text stands for, that is its code points (as Python's ``len`` does
on the parsed string, and as the ``jsonschema`` library checks). An escape stands for one
code point (``\\n``, ``\\u00e9``), except that a code point past U+FFFF is written as two
escapes, a surrogate pair (``\\ud83d\\ude00`` is one character, 😀). A lone surrogate escape
stands for no character at all, so these expressions do not allow one (Python's ``json``
reads it into a string holding a lone surrogate; RFC 8259 leaves its meaning open).
"""

from __future__ import annotations

import json
import re

from .token_constraint import TokenConstraint, regex_constraint

# One character inside a JSON string: anything but a quote, a backslash or a control
# character; or an escape: a short one, \u and four hex digits that are not a surrogate
# (D800-DFFF), or a surrogate pair (a high surrogate D800-DBFF, then a low one DC00-DFFF),
# which together stand for one character past U+FFFF.
HEX = "[0-9a-fA-F]"
JSON_CHAR = (
    r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]'
    rf"|\\u(?:[0-9a-cA-Ce-fE-F]{HEX}{{3}}|[dD][0-7]{HEX}{{2}})"
    rf"|\\u[dD][89abAB]{HEX}{{2}}\\u[dD][c-fC-F]{HEX}{{2}})"
)
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
    ### BEGIN SOLUTION
    # Hint: one case per kind of schema, calling itself for properties and items; re.escape every literal.
    if "enum" in schema:
        return "(?:" + "|".join(re.escape(json.dumps(value, ensure_ascii=False)) for value in schema["enum"]) + ")"
    kind = schema["type"]
    if kind == "integer":
        return JSON_INTEGER
    if kind == "boolean":
        return "(?:true|false)"
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        return f'"{JSON_CHAR}{{{low},{"" if high is None else high}}}"'
    if kind == "array":
        item = schema_to_regex(schema["items"])
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return r"\[\]"
        # The first item, then ", item" for each of the others.
        rest = f"(?:, {item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        return rf"\[{item}{rest}\]" if low > 0 else rf"\[(?:{item}{rest})?\]"
    fields = [re.escape(json.dumps(key, ensure_ascii=False)) + ": " + schema_to_regex(value) for key, value in schema["properties"].items()]
    return r"\{" + ", ".join(fields) + r"\}"
    ### END SOLUTION


def json_schema_constraint(schema: dict, tokenizer, d_vocab: int | None = None) -> TokenConstraint:
    """A ``TokenConstraint`` whose completed texts are the JSON texts of ``schema`` (see ``schema_to_regex``)."""
    return regex_constraint(schema_to_regex(schema), tokenizer, d_vocab)


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


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
