"""How to put right each of part 8's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "tokens decoded as text instead of bytes (a split character becomes U+FFFD)":
        ("map each character of the token's name back through GPT-2's byte table, bytes(byte_of_char[c] for c in "
         "name), instead of decoding it"),
    "special tokens read as text": "give the special tokens None instead of the bytes of their names",
    "non-printable bytes shifted by their own value, not counted in order":
        "number the non-printable bytes in order: the n-th of them becomes chr(256 + n)",
    "only a token's first byte checked":
        "step the automaton through every byte of the token and return None as soon as a step fails",
    "EOS allowed in non-accepting states": "allow the end-of-text token only where automaton.is_accepting(state)",
    "only the start state explored": "append each newly numbered state to the queue so it gets a row of its own",
    "forbidden tokens multiplied by zero instead of set to -inf":
        "set forbidden logits to -inf: logits.masked_fill(~allowed[states], float(\"-inf\"))",
    "finished rows' state not advanced (a row that read EOS keeps its state)":
        "look every token up in the row, row[token], which sends end-of-text to DONE",
    "a finished row's pads read through the index": "keep a DONE row DONE without looking its token up",
    "masking after the temperature-scaled softmax and the filters instead of the logits":
        ("mask the processed logits with constraint.mask_logits before choose_tokens, so the temperature and filters "
         "see only allowed tokens"),
    "the constraint never ends a row":
        "mark rows finished when the constraint says so: finished |= constraint.finished(states)",
    "enum values not escaped": "escape each JSON-encoded value with re.escape before joining them with |",
    "strings allow any character but a quote":
        ("match each character with JSON_CHAR: anything but a quote, a backslash or a control character, or a valid "
         "escape"),
    "integers with leading zeros": "match integers as -?(?:0|[1-9][0-9]*)",
    "q taken as the model's probability (no renormalisation)":
        "subtract the allowed log-mass at each step from the token's log-probability before summing",
    "a member's tokenizations not added together":
        "add the probabilities of all its tokenizations: torch.logsumexp over the text's path log-probabilities",
    "KL with its arguments swapped": "sum p(x) * log(p(x) / q(x)) over the texts",
    "KL in bits": "use math.log, the natural logarithm",
}
