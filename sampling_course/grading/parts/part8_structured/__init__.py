"""Part 8, structured generation: its exercises (what each asks, three graded hints), its planted
mistakes and its planted correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 8
TITLE = "Structured generation"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "token_bytes", 8, "token_index", "token_bytes",
        "The bytes each token of a GPT-2-style tokenizer stands for, by token id (None for special tokens).",
        "GPT-2 stores every byte of a token as one printable character. Undo that table, byte by byte; "
        "do not decode tokens as text: a token can hold half of a character.",
        "The printable bytes ! to ~, ¡ to ¬ and ® to ÿ stand for themselves; the 68 others, in increasing "
        "order, are written as chr(256), chr(257), ... (so the space, byte 32, is 'Ġ'). Build byte -> char, "
        "invert it, and read tokenizer.convert_ids_to_tokens(...) through it. tokenizer.decode([id]) turns "
        "half a character into '\\ufffd' and loses the bytes.",
        "printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]\n"
        "char_of_byte = {b: chr(b) for b in printable}\n"
        "for shifted, b in enumerate(b for b in range(256) if b not in char_of_byte): char_of_byte[b] = chr(256 + shifted)\n"
        "byte_of_char = {c: b for b, c in char_of_byte.items()}\n"
        "return [None if i in set(tokenizer.all_special_ids) else bytes(byte_of_char[c] for c in name) for i, name in enumerate(names)]",
    ),
    exercise(
        "walk_token", 8, "token_index", "walk_token",
        "The automaton's state after reading every byte of a token, or None when some byte is refused.",
        "A token may follow only if the whole of it keeps the text in the language, not just its first "
        "character: step through all its bytes.",
        "automaton.step(state, byte) gives the next state or None. Iterating over a bytes object gives ints, "
        "which is what step takes. Stop at the first None.",
        "for byte in token:\n"
        "    state = automaton.step(state, byte)\n"
        "    if state is None: return None\n"
        "return state",
    ),
    exercise(
        "build_index", 8, "token_index", "build_index",
        "For every state reachable token by token: the tokens allowed there and the state each leads to; "
        "the end-of-text token exactly in accepting states.",
        "Explore breadth-first from automaton.initial with a queue. Each state that walk_token reaches for the "
        "first time gets the next number and joins the queue. Skip the special tokens (None).",
        "transitions[i] is the row of the i-th state taken from the queue, so number states in the order "
        "they join it (the start is 0). Add eos_token_id -> DONE to a row only when "
        "automaton.is_accepting(state): allowing EOS anywhere else ends texts that are not members.",
        "number, queue, transitions = {automaton.initial: 0}, [automaton.initial], []\n"
        "for state in queue:\n"
        "    row = {}\n"
        "    for token_id, token in enumerate(vocabulary):\n"
        "        target = None if token is None else walk_token(automaton, state, token)\n"
        "        if target is None: continue\n"
        "        if target not in number: number[target] = len(queue); queue.append(target)\n"
        "        row[token_id] = number[target]\n"
        "    if automaton.is_accepting(state): row[eos_token_id] = DONE\n"
        "    transitions.append(row)\n"
        "return TokenIndex(transitions, eos_token_id)",
    ),
    exercise(
        "TokenConstraint", 8, "token_constraint", "TokenConstraint",
        "mask_logits: -inf for every token a row's state forbids. advance: each row's state after its token; "
        "EOS leads to DONE, and a DONE row stays DONE.",
        "self.allowed has one row per state and a last row for DONE (-1), so allowed[states] gives each row "
        "of the batch its own mask. In advance, a finished row must stay finished whatever it reads: it reads pads.",
        "mask_logits: logits.masked_fill(~allowed[states], float('-inf')). advance: loop over "
        "zip(states.tolist(), tokens.tolist()); DONE stays DONE; otherwise look the token up in "
        "self.index.transitions[state] (EOS is in there and leads to DONE) and raise a ValueError when it is missing.",
        "return logits.masked_fill(~allowed[states], float('-inf'))\n"
        "...\n"
        "for state, token in zip(states.tolist(), tokens.tolist()):\n"
        "    if state == DONE: next_states.append(DONE); continue\n"
        "    row = self.index.transitions[state]\n"
        "    if token not in row: raise ValueError(...)\n"
        "    next_states.append(row[token])\n"
        "return torch.tensor(next_states, dtype=states.dtype, device=states.device)",
    ),
    exercise(
        "constrained_generate", 8, "generate", "generate",
        "In your part-5 generate: with a constraint, mask each step's logits before sampling, advance every "
        "row's state after it, and end a row when its constraint has read EOS.",
        "Mask the logits, not the probabilities after the temperature and the filters: top-k and top-p must "
        "choose among the allowed tokens, or they may keep none of them.",
        "Right after process_logits: processed = constraint.mask_logits(processed, states). After the pads "
        "are put in: states = constraint.advance(states, next_tokens). After stopped_rows: "
        "finished |= constraint.finished(states), then states = states.masked_fill(finished, constraint.DONE).",
        "processed = process_logits(...)\n"
        "if constraint is not None: processed = constraint.mask_logits(processed, states)\n"
        "next_tokens, drawn_from, mu = choose_tokens(processed, ...); next_tokens = next_tokens.masked_fill(finished, pad_token_id)\n"
        "if constraint is not None: states = constraint.advance(states, next_tokens)\n"
        "...\n"
        "finished |= stopped_rows(criteria, input_ids, processed)\n"
        "if constraint is not None:\n"
        "    finished |= constraint.finished(states)\n"
        "    states = states.masked_fill(finished, constraint.DONE)",
    ),
    exercise(
        "schema_to_regex", 8, "json_schema", "schema_to_regex",
        "A regular expression matching exactly the JSON texts of a schema (objects with fixed keys, strings, "
        "integers, booleans, enums, arrays), laid out as json.dumps writes them.",
        "Recurse: an object is its keys and values joined by ', ', an array its items. Every literal (keys, enum "
        "values, brackets) goes through re.escape: a '.' or '*' in an enum value is not a wildcard.",
        "A string is '\"' + JSON_CHAR{min,max} + '\"' (JSON_CHAR excludes a bare quote, backslash and control "
        "characters, and allows escapes); an integer is JSON_INTEGER (no leading zeros). An array with items "
        "from min to max: \\[item(?:, item){min-1,max-1}\\], the whole inside optional when min is 0.",
        "if 'enum' in schema: return '(?:' + '|'.join(re.escape(json.dumps(v, ensure_ascii=False)) for v in schema['enum']) + ')'\n"
        "integer -> JSON_INTEGER; boolean -> '(?:true|false)'; string -> f'\"{JSON_CHAR}{{{low},{high}}}\"'\n"
        "array -> rf'\\[(?:{item}(?:, {item}){{0,{high - 1}}})?\\]'\n"
        "object -> r'\\{' + ', '.join(re.escape(json.dumps(k)) + ': ' + schema_to_regex(v) for k, v in properties.items()) + r'\\}'",
    ),
    exercise(
        "exact_laws", 8, "distortion", "exact_laws",
        "From every path of a finite language: the model's p(x | x in L) and the law q(x) of "
        "mask-and-renormalise sampling, per member text.",
        "A path's model probability is the product of its tokens' probabilities; its masked probability "
        "divides each factor by the mass of the tokens allowed at that step. Several paths can spell one "
        "text (different tokenizations): add them.",
        "Sum logs along a path (sum(path.logprobs), and sum(lp - mass) for q); add paths of one text with "
        "logsumexp; normalise p by the logsumexp over all texts, but not q. Work in log space: model "
        "probabilities of whole texts can be far below 1e-300.",
        "log_p[text].append(sum(path.logprobs))\n"
        "log_q[text].append(sum(lp - m for lp, m in zip(path.logprobs, path.allowed_logmass)))\n"
        "p_text = logsumexp over each text's paths; p = exp(p_text - logsumexp(p_text)); q = exp(q_text)",
    ),
    exercise(
        "kl_divergence", 8, "distortion", "kl_divergence",
        "KL(p || q) = sum of p(x) log(p(x) / q(x)) over the outcomes, in nats.",
        "Natural logarithms. Outcomes with p(x) = 0 add nothing (p log p -> 0); p(x) > 0 with q(x) = 0 makes "
        "it infinite.",
        "Loop over p.items(), skip p(x) == 0, return math.inf when q.get(x, 0) == 0, else add "
        "px * math.log(px / qx). The order of the arguments matters: KL is not symmetric.",
        "total = 0.0\n"
        "for x, px in p.items():\n"
        "    if px == 0: continue\n"
        "    qx = q.get(x, 0.0)\n"
        "    if qx == 0: return math.inf\n"
        "    total += px * math.log(px / qx)\n"
        "return total",
    ),
)

# The files of part 8 (and part 5's generate.py, where the constraint hooks in).
_I, _C, _J, _D, _G = "token_index.py", "token_constraint.py", "json_schema.py", "distortion.py", "generate.py"

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the named test file catches it.
MISTAKES: list[Mistake] = [
    Mistake(8, "tokens decoded as text instead of bytes (a split character becomes U+FFFD)", _I,
            "    return [None if token_id in special else bytes(byte_of_char[c] for c in name) for token_id, name in enumerate(names)]",
            "    return [None if token_id in special else tokenizer.decode([token_id]).encode(\"utf-8\") for token_id in range(len(names))]",
            why="each token decoded as text and encoded again, which turns a token holding part of a character into the replacement character's bytes."),
    Mistake(8, "special tokens read as text", _I,
            "    return [None if token_id in special else bytes(byte_of_char[c] for c in name) for token_id, name in enumerate(names)]",
            "    return [bytes(byte_of_char[c] for c in name) for name in names]",
            why="the end-of-text token read as the text '<|endoftext|>' instead of None."),
    Mistake(8, "non-printable bytes shifted by their own value, not counted in order", _I,
            "        char_of_byte[b] = chr(256 + shifted)", "        char_of_byte[b] = chr(256 + b)",
            why="the 68 non-printable bytes written as chr(256 + byte) instead of chr(256), chr(257), ... in order."),
    Mistake(8, "only a token's first byte checked", _I,
            "    for byte in token:\n        state = automaton.step(state, byte)\n        if state is None:\n            return None\n    return state\n",
            "    return automaton.step(state, token[0])\n",
            why="only the first byte of the token is checked, so a token may start right and then leave the language."),
    Mistake(8, "EOS allowed in non-accepting states", _I,
            "        if automaton.is_accepting(state):\n            row[eos_token_id] = DONE\n",
            "        row[eos_token_id] = DONE\n",
            why="the end-of-text token allowed in every state, so a text can end before it is a member."),
    Mistake(8, "only the start state explored", _I,
            "                number[target] = len(queue)\n                queue.append(target)\n",
            "                number[target] = len(queue)\n",
            why="states reached from the start are numbered but never explored, so they get no row."),
    Mistake(8, "forbidden tokens multiplied by zero instead of set to -inf", _C,
            "        return torch.where(allowed[states], logits, float(\"-inf\"))",
            "        return logits * allowed[states]",
            why="forbidden logits set to 0, which leaves them a probability of their own."),
    Mistake(8, "finished rows' state not advanced (a row that read EOS keeps its state)", _C,
            "            next_states.append(row[token])",
            "            next_states.append(state if token == self.eos_token_id else row[token])",
            why="a row that reads the end-of-text token keeps its state instead of moving to DONE, so it never finishes."),
    Mistake(8, "a finished row's pads read through the index", _C,
            "            if state == DONE:\n                next_states.append(DONE)\n                continue\n",
            "",
            why="a finished (DONE) row looks its pad up in the index instead of staying DONE."),
    Mistake(8, "masking after the temperature-scaled softmax and the filters instead of the logits", _G,
            "            processed = constraint.mask_logits(processed, states)\n"
            "        next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)\n",
            "            if settings.temperature > 0:\n"
            "                from .batched_sampling import warp_logits\n\n"
            "                warped = warp_logits(processed, settings)\n"
            "                probs = constraint.mask_logits(warped.softmax(dim=-1).log(), states).exp()\n"
            "                next_tokens = torch.multinomial(probs / probs.sum(dim=-1, keepdim=True), 1, generator=generator)[:, 0]\n"
            "                drawn_from = probs.log()\n"
            "            else:\n"
            "                next_tokens, drawn_from, mu = choose_tokens(constraint.mask_logits(processed, states), settings, generator, mu)\n"
            "        else:\n"
            "            next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)\n",
            why="the mask applied to the probabilities after the temperature and the filters, so top-k and top-p choose among all tokens."),
    Mistake(8, "the constraint never ends a row", _G,
            "            finished |= constraint.finished(states)\n", "",
            why="rows that read the end-of-text token are not marked finished by the constraint."),
    Mistake(8, "enum values not escaped", _J,
            "        return \"(?:\" + \"|\".join(re.escape(json.dumps(value, ensure_ascii=False)) for value in schema[\"enum\"]) + \")\"",
            "        return \"(?:\" + \"|\".join(json.dumps(value, ensure_ascii=False) for value in schema[\"enum\"]) + \")\"",
            why="enum values put into the expression unescaped, so '.' and '*' in them act as wildcards."),
    Mistake(8, "strings allow any character but a quote", _J,
            "        return f'\"{JSON_CHAR}{{{low},{\"\" if high is None else high}}}\"'",
            "        return f'\"[^\"]{{{low},{\"\" if high is None else high}}}\"'",
            why="string characters written as [^\"], which lets a bare backslash or a control character in."),
    Mistake(8, "integers with leading zeros", _J,
            "        return JSON_INTEGER\n", "        return r\"-?[0-9]+\"\n",
            why="integers as -?[0-9]+, which allows 007, not JSON."),
    Mistake(8, "q taken as the model's probability (no renormalisation)", _D,
            "        log_q[path.text].append(sum(lp - mass for lp, mass in zip(path.logprobs, path.allowed_logmass)))",
            "        log_q[path.text].append(sum(path.logprobs))",
            why="the masked law computed without dividing by the allowed mass at each step."),
    Mistake(8, "a member's tokenizations not added together", _D,
            "    p_text = torch.tensor([torch.logsumexp(torch.tensor(log_p[t], dtype=torch.float64), 0).item() for t in texts], dtype=torch.float64)",
            "    p_text = torch.tensor([log_p[t][-1] for t in texts], dtype=torch.float64)",
            why="only one path per member counted, where every tokenization of the text adds to its probability."),
    Mistake(8, "KL with its arguments swapped", _D,
            "        total += px * math.log(px / qx)", "        total += qx * math.log(qx / px)",
            why="KL(q || p) computed where KL(p || q) is asked for."),
    Mistake(8, "KL in bits", _D,
            "        total += px * math.log(px / qx)", "        total += px * math.log2(px / qx)",
            why="base-2 logarithms, where nats (natural logarithms) are asked for."),
]

# Correct implementations in other styles: every test of their exercise must pass.
VARIANTS: list[Variant] = [
    Variant(8, "token_bytes", "the byte table from two lists zipped, tokens read with map", _I,
            "    printable = [*range(ord(\"!\"), ord(\"~\") + 1), *range(ord(\"¡\"), ord(\"¬\") + 1), *range(ord(\"®\"), ord(\"ÿ\") + 1)]\n"
            "    char_of_byte = {b: chr(b) for b in printable}\n"
            "    for shifted, b in enumerate(b for b in range(256) if b not in char_of_byte):\n"
            "        char_of_byte[b] = chr(256 + shifted)\n"
            "    byte_of_char = {char: b for b, char in char_of_byte.items()}\n"
            "    special = set(tokenizer.all_special_ids)\n"
            "    return [None if token_id in special else bytes(byte_of_char[c] for c in name) for token_id, name in enumerate(names)]\n",
            "    kept = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))\n"
            "    others = [b for b in range(256) if b not in kept]\n"
            "    byte_of_char = dict(zip(map(chr, kept + list(range(256, 256 + len(others)))), kept + others))\n"
            "    vocabulary = []\n"
            "    for token_id, name in enumerate(names):\n"
            "        if token_id in tokenizer.all_special_ids:\n"
            "            vocabulary.append(None)\n"
            "        else:\n"
            "            vocabulary.append(bytes(map(byte_of_char.__getitem__, name)))\n"
            "    return vocabulary\n"),
    Variant(8, "token_bytes", "special tokens found by name, bytes gathered in a bytearray", _I,
            "    special = set(tokenizer.all_special_ids)\n"
            "    return [None if token_id in special else bytes(byte_of_char[c] for c in name) for token_id, name in enumerate(names)]\n",
            "    special_names = set(tokenizer.all_special_tokens)\n"
            "    out = []\n"
            "    for name in names:\n"
            "        data = bytearray()\n"
            "        for c in name:\n"
            "            data.append(byte_of_char[c])\n"
            "        out.append(None if name in special_names else bytes(data))\n"
            "    return out\n"),
    Variant(8, "walk_token", "recursion, one byte per call", _I,
            "    for byte in token:\n        state = automaton.step(state, byte)\n        if state is None:\n            return None\n    return state\n",
            "    state = automaton.step(state, token[0])\n"
            "    if state is None or len(token) == 1:\n"
            "        return state\n"
            "    return walk_token(automaton, state, token[1:])\n"),
    Variant(8, "walk_token", "an index loop with while", _I,
            "    for byte in token:\n        state = automaton.step(state, byte)\n        if state is None:\n            return None\n    return state\n",
            "    i = 0\n"
            "    while state is not None and i < len(token):\n"
            "        state = automaton.step(state, token[i])\n"
            "        i += 1\n"
            "    return state\n"),
    Variant(8, "build_index", "a deque popped from the left, numbers from the dict's size", _I,
            "    number = {automaton.initial: 0}\n"
            "    queue = [automaton.initial]\n"
            "    transitions: list[dict[int, int]] = []\n"
            "    for state in queue:  # the queue grows while it is read\n"
            "        row: dict[int, int] = {}\n"
            "        for token_id, token in enumerate(vocabulary):\n"
            "            if token is None:\n"
            "                continue\n"
            "            target = walk_token(automaton, state, token)\n"
            "            if target is None:\n"
            "                continue\n"
            "            if target not in number:\n"
            "                number[target] = len(queue)\n"
            "                queue.append(target)\n",
            "    from collections import deque\n"
            "\n"
            "    number = {automaton.initial: 0}\n"
            "    todo = deque([automaton.initial])\n"
            "    transitions: list[dict[int, int]] = []\n"
            "    while todo:\n"
            "        state = todo.popleft()\n"
            "        row: dict[int, int] = {}\n"
            "        for token_id, token in enumerate(vocabulary):\n"
            "            target = None if token is None else walk_token(automaton, state, token)\n"
            "            if target is None:\n"
            "                continue\n"
            "            if target not in number:\n"
            "                number[target] = len(number)\n"
            "                todo.append(target)\n"),
    Variant(8, "build_index", "EOS first, tokens through a dict comprehension of walks", _I,
            "        row: dict[int, int] = {}\n"
            "        for token_id, token in enumerate(vocabulary):\n"
            "            if token is None:\n"
            "                continue\n"
            "            target = walk_token(automaton, state, token)\n"
            "            if target is None:\n"
            "                continue\n"
            "            if target not in number:\n"
            "                number[target] = len(queue)\n"
            "                queue.append(target)\n"
            "            row[token_id] = number[target]\n"
            "        if automaton.is_accepting(state):\n"
            "            row[eos_token_id] = DONE\n",
            "        row: dict[int, int] = {eos_token_id: DONE} if automaton.is_accepting(state) else {}\n"
            "        walks = {i: walk_token(automaton, state, t) for i, t in enumerate(vocabulary) if t is not None}\n"
            "        for token_id, target in walks.items():\n"
            "            if target is not None:\n"
            "                row[token_id] = number.setdefault(target, len(number))\n"
            "                if row[token_id] == len(queue):\n"
            "                    queue.append(target)\n"),
    Variant(8, "TokenConstraint", "torch.where with a -1e10 mask", _C,
            "        return torch.where(allowed[states], logits, float(\"-inf\"))",
            "        return torch.where(allowed[states], logits, torch.full_like(logits, -1e10))"),
    Variant(8, "TokenConstraint", "advance written with a list comprehension and a checked lookup", _C,
            "        next_states = []\n"
            "        for state, token in zip(states.tolist(), tokens.tolist()):\n"
            "            if state == DONE:\n"
            "                next_states.append(DONE)\n"
            "                continue\n"
            "            row = self.index.transitions[state]\n"
            "            if token not in row:\n"
            "                raise ValueError(f\"token {token} may not follow state {state}: was the mask applied before sampling?\")\n"
            "            next_states.append(row[token])\n"
            "        return torch.tensor(next_states, dtype=states.dtype, device=states.device)\n",
            "        def follow(state: int, token: int) -> int:\n"
            "            if state == DONE:\n"
            "                return DONE\n"
            "            target = self.index.transitions[state].get(token)\n"
            "            if target is None:\n"
            "                raise ValueError(f\"token {token} is not allowed in state {state}\")\n"
            "            return target\n"
            "\n"
            "        return states.new_tensor([follow(s, t) for s, t in zip(states.tolist(), tokens.tolist())])\n"),
    Variant(8, "constrained_generate", "the mask applied to the raw logits, before the penalties (they leave -inf alone)", _G,
            "        processed = process_logits(logits, input_ids, attention_mask, step, settings, eos_token_id, dry_breakers)\n"
            "        if constraint is not None:\n"
            "            # Before the temperature and the filters, so that they choose among allowed tokens only.\n"
            "            processed = constraint.mask_logits(processed, states)\n",
            "        masked = logits if constraint is None else constraint.mask_logits(logits, states)\n"
            "        processed = process_logits(masked, input_ids, attention_mask, step, settings, eos_token_id, dry_breakers)\n"),
    Variant(8, "constrained_generate", "finished rows' states set with torch.where", _G,
            "            finished |= constraint.finished(states)\n"
            "            states = states.masked_fill(finished, constraint.DONE)\n",
            "            finished = finished | constraint.finished(states)\n"
            "            states = torch.where(finished, torch.full_like(states, constraint.DONE), states)\n"),
    Variant(8, "schema_to_regex", "a dispatch table of small functions", _J,
            "    if \"enum\" in schema:\n"
            "        return \"(?:\" + \"|\".join(re.escape(json.dumps(value, ensure_ascii=False)) for value in schema[\"enum\"]) + \")\"\n"
            "    kind = schema[\"type\"]\n"
            "    if kind == \"integer\":\n"
            "        return JSON_INTEGER\n"
            "    if kind == \"boolean\":\n"
            "        return \"(?:true|false)\"\n",
            "    literal = lambda value: re.escape(json.dumps(value, ensure_ascii=False))\n"
            "    if \"enum\" in schema:\n"
            "        return \"(\" + \"|\".join(map(literal, schema[\"enum\"])) + \")\"\n"
            "    kind = schema[\"type\"]\n"
            "    simple = {\"integer\": lambda: \"-?(0|[1-9][0-9]*)\", \"boolean\": lambda: \"(true|false)\"}\n"
            "    if kind in simple:\n"
            "        return simple[kind]()\n"),
    Variant(8, "schema_to_regex", "arrays as alternatives of every allowed length", _J,
            "        if high == 0:\n"
            "            return r\"\\[\\]\"\n"
            "        # The first item, then \", item\" for each of the others.\n"
            "        rest = f\"(?:, {item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}\"\n"
            "        return rf\"\\[{item}{rest}\\]\" if low > 0 else rf\"\\[(?:{item}{rest})?\\]\"\n",
            "        if high is None:\n"
            "            tail = f\"(?:, {item})*\"\n"
            "            return rf\"\\[{', '.join([item] * low)}{tail}\\]\" if low else rf\"\\[(?:{item}{tail})?\\]\"\n"
            "        options = \"|\".join(\", \".join([item] * n) for n in range(max(low, 1), high + 1))\n"
            "        if not options:\n"
            "            return r\"\\[\\]\"\n"
            "        return rf\"\\[(?:{options})\\]\" if low else rf\"\\[(?:{options})?\\]\"\n"),
    Variant(8, "exact_laws", "plain Python with a max-shifted logsumexp", _D,
            "    texts = list(log_p)\n"
            "    p_text = torch.tensor([torch.logsumexp(torch.tensor(log_p[t], dtype=torch.float64), 0).item() for t in texts], dtype=torch.float64)\n"
            "    q_text = torch.tensor([torch.logsumexp(torch.tensor(log_q[t], dtype=torch.float64), 0).item() for t in texts], dtype=torch.float64)\n"
            "    p_text = (p_text - torch.logsumexp(p_text, 0)).exp()\n"
            "    return dict(zip(texts, p_text.tolist())), dict(zip(texts, q_text.exp().tolist()))\n",
            "    def lse(values):\n"
            "        top = max(values)\n"
            "        return top + math.log(sum(math.exp(v - top) for v in values))\n"
            "\n"
            "    p_log = {t: lse(v) for t, v in log_p.items()}\n"
            "    total = lse(list(p_log.values()))\n"
            "    return {t: math.exp(v - total) for t, v in p_log.items()}, {t: math.exp(lse(v)) for t, v in log_q.items()}\n"),
    Variant(8, "exact_laws", "one tensor of paths and a scatter by text", _D,
            "    log_p: dict[str, list[float]] = defaultdict(list)\n"
            "    log_q: dict[str, list[float]] = defaultdict(list)\n"
            "    for path in paths:\n"
            "        log_p[path.text].append(sum(path.logprobs))\n"
            "        log_q[path.text].append(sum(lp - mass for lp, mass in zip(path.logprobs, path.allowed_logmass)))\n"
            "    texts = list(log_p)\n",
            "    texts = list(dict.fromkeys(path.text for path in paths))\n"
            "    where = torch.tensor([texts.index(path.text) for path in paths])\n"
            "    lp = torch.tensor([sum(path.logprobs) for path in paths], dtype=torch.float64)\n"
            "    lq = lp - torch.tensor([sum(path.allowed_logmass) for path in paths], dtype=torch.float64)\n"
            "    log_p = {t: lp[where == i].tolist() for i, t in enumerate(texts)}\n"
            "    log_q = {t: lq[where == i].tolist() for i, t in enumerate(texts)}\n"),
    Variant(8, "kl_divergence", "tensors over the support of p", _D,
            "    total = 0.0\n"
            "    for x, px in p.items():\n"
            "        if px == 0:\n"
            "            continue\n"
            "        qx = q.get(x, 0.0)\n"
            "        if qx == 0:\n"
            "            return math.inf\n"
            "        total += px * math.log(px / qx)\n"
            "    return total\n",
            "    support = [x for x, px in p.items() if px > 0]\n"
            "    ps = torch.tensor([p[x] for x in support], dtype=torch.float64)\n"
            "    qs = torch.tensor([q.get(x, 0.0) for x in support], dtype=torch.float64)\n"
            "    if (qs == 0).any():\n"
            "        return math.inf\n"
            "    return float((ps * (ps.log() - qs.log())).sum())\n"),
    Variant(8, "kl_divergence", "cross-entropy minus entropy with math.fsum", _D,
            "    total = 0.0\n"
            "    for x, px in p.items():\n"
            "        if px == 0:\n"
            "            continue\n"
            "        qx = q.get(x, 0.0)\n"
            "        if qx == 0:\n"
            "            return math.inf\n"
            "        total += px * math.log(px / qx)\n"
            "    return total\n",
            "    terms = [(px, q.get(x, 0.0)) for x, px in p.items() if px > 0]\n"
            "    if any(qx == 0 for _, qx in terms):\n"
            "        return math.inf\n"
            "    return math.fsum(px * math.log(px) for px, _ in terms) - math.fsum(px * math.log(qx) for px, qx in terms)\n"),
]
from sampling_course.grading.parts.part8_structured.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES, FIXES)
