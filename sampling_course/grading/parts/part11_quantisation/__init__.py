"""Part 11, quantisation: its exercises (what each asks, three graded hints), planted mistakes and correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 11
TITLE = "Quantisation"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "quantise_int8", 11, "quantise", "quantise_int8",
        "Symmetric int8 per output channel: scale = max|w_row| / 127, q = round(w / scale) clamped to [-127, 127].",
        "Each row of the (out, in) matrix is one output channel with its own scale, chosen so that the row's "
        "largest magnitude becomes 127 and nothing is clipped (LLM.int8()'s absmax, one scale per row).",
        "The scale is the row's MAXIMUM magnitude over 127 (abs().amax(dim=1), keeping one value per row), not its "
        "mean. Divide by the scale first and round the quotient: rounding w first loses everything below 1.",
        "scale = weight.abs().amax(dim=1) / 127\n"
        "q = torch.round(weight / scale[:, None]).clamp(-127, 127)\n"
        "return q.to(torch.int8), scale",
    ),
    exercise(
        "dequantise_int8", 11, "quantise", "dequantise_int8",
        "q * scale per row, computed in float32 and returned in the dtype asked for.",
        "Each row's codes times that row's scale: scale is (out,), so give it a trailing dimension to broadcast.",
        "int8 times float32 is float32 whatever dtype asks: cast at the end with .to(dtype), so a bfloat16 "
        "model gets bfloat16 weights (rounded once, from the float32 product).",
        "return (q.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)",
    ),
    exercise(
        "quantise_groups", 11, "quantise", "quantise_groups",
        "Asymmetric 4-bit (2**bits levels) per group of group_size consecutive inputs of a row: a scale and a "
        "zero point per group, codes clamp(round(w / scale) + zero_point, 0, 2**bits - 1).",
        "View the (out, in) matrix as (out, groups, group_size): a group is group_size CONSECUTIVE inputs of one "
        "row. Its range [min, max], widened to include 0, is cut into 2**bits - 1 equal steps.",
        "scale = (max - min) / (2**bits - 1) with min = min(group min, 0) and max = max(group max, 0); the "
        "zero point is the code of 0, round(-min / scale) (not one more or less). Divide, then round, then add it.",
        "grouped = weight.reshape(out, n_groups, group_size)\n"
        "low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)\n"
        "scale = (high - low) / top; zero_point = torch.round(-low / scale)\n"
        "q = (torch.round(grouped / scale[..., None]) + zero_point[..., None]).clamp(0, top)\n"
        "return q.reshape(weight.shape).to(torch.uint8), scale, zero_point",
    ),
    exercise(
        "dequantise_groups", 11, "quantise", "dequantise_groups",
        "(q - zero_point) * scale per group, computed in float32 and returned in the dtype asked for.",
        "The same (out, groups, group_size) view as quantise_groups; each group's scale and zero point "
        "broadcast over its group_size codes.",
        "Convert the codes to float32 BEFORE subtracting the zero point: uint8 arithmetic wraps around, so a "
        "code below its zero point would become a large positive number. Cast to dtype at the end.",
        "grouped = q.reshape(q.shape[0], n_groups, group_size).float()\n"
        "w = (grouped - zero_point.float()[..., None]) * scale.float()[..., None]\n"
        "return w.reshape(q.shape).to(dtype)",
    ),
    exercise(
        "nf4_levels", 11, "nf4", "nf4_levels",
        "QLoRA's 16 NF4 levels: normal quantiles (8 positive, 7 negative) and an exact 0, scaled to [-1, 1].",
        "Equal probability mass per level: take N(0, 1) quantiles at probabilities evenly spaced between 1/2 "
        "and the outer probability NF4_OUTER_PROBABILITY (the probability 1 would give an infinite quantile).",
        "torch.special.ndtri is the normal quantile. Positive side: 9 points from p down to 0.5, dropping the "
        "last (0.5 gives 0); negative: 8 points, dropping the last, negated. Add 0, sort, divide by the largest.",
        "positive = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])\n"
        "negative = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])\n"
        "levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values\n"
        "return (levels / levels.max()).to(torch.float32)",
    ),
    exercise(
        "quantise_nf4", 11, "nf4", "quantise_nf4",
        "NF4 per group: absmax = max|w| of the group, and each weight's code is the index of the level nearest to w / absmax.",
        "The same (out, groups, group_size) view as the 4-bit exercise; one absmax per group brings the group "
        "into [-1, 1], where the levels live.",
        "Nearest means the smallest |w / absmax - level| over the 16 levels (argmin over a last dimension of 16), "
        "not the level just above or below (bucketize on the levels themselves rounds one way only).",
        "grouped = weight.reshape(out, n_groups, group_size); absmax = grouped.abs().amax(-1)\n"
        "normalised = grouped / absmax[..., None]\n"
        "codes = (normalised[..., None] - levels).abs().argmin(dim=-1)\n"
        "return codes.reshape(weight.shape).to(torch.uint8), absmax",
    ),
    exercise(
        "dequantise_nf4", 11, "nf4", "dequantise_nf4",
        "levels[code] * absmax per group, computed in float32 and returned in the dtype asked for.",
        "Look each code up in nf4_levels() (index with the codes as long integers), then scale each group by its absmax.",
        "Reshape to (out, groups, group_size) so that absmax[..., None] broadcasts over its group, and cast "
        "to dtype at the very end.",
        "values = levels[codes.long()].reshape(codes.shape[0], n_groups, group_size)\n"
        "return (values * absmax.float()[..., None]).reshape(codes.shape).to(dtype)",
    ),
    exercise(
        "double_quantise", 11, "nf4", "double_quantise",
        "Optional (QLoRA's double quantisation): store the absmaxes themselves in int8, blocks of block_size with "
        "one float32 scale each, after subtracting their mean.",
        "The absmaxes are all positive: subtracting their mean centres them on 0, where a symmetric int8 code "
        "spends its range on both signs. Then it is exercise 1 again, on rows of block_size absmaxes.",
        "Flatten, subtract offset = mean, pad with zeros to a whole number of blocks, reshape to "
        "(n_blocks, block_size) and call quantise_int8. Keep the offset: DoubleQuantised.dequantise adds it back.",
        "offset = flat.mean()\n"
        "padded = torch.cat([flat - offset, flat.new_zeros(n_blocks * block_size - flat.numel())])\n"
        "codes, scales = quantise_int8(padded.reshape(n_blocks, block_size))\n"
        "return DoubleQuantised(codes.flatten(), scales, offset, tuple(absmax.shape), block_size)",
        optional=True,
    ),
    exercise(
        "quantise_matrix", 11, "quantised_model", "quantise_matrix",
        "Store an (out, in) matrix in a scheme: the tensors your quantiser returns, 4-bit codes packed two per byte.",
        "Branch on scheme.kind (\"int8\", \"int4\", \"nf4\") and call the exercise that makes that format, with "
        "scheme.group_size; pack_int4 halves the 4-bit codes' bytes.",
        "int4 returns (packed, scale, zero_point as uint8: whole numbers 0-15, one byte each); nf4 returns "
        "(packed, absmax), or with scheme.double_quant the DoubleQuantised's codes, scales and offset instead of absmax.",
        "if scheme.kind == 'int8': return quantise_int8(matrix)\n"
        "if scheme.kind == 'int4': q, s, z = quantise_groups(matrix, scheme.group_size); return pack_int4(q), s, z.to(torch.uint8)\n"
        "codes, absmax = quantise_nf4(matrix, scheme.group_size)\n"
        "if not scheme.double_quant: return pack_int4(codes), absmax\n"
        "dq = double_quantise(absmax); return pack_int4(codes), dq.codes, dq.scales, dq.offset",
    ),
    exercise(
        "dequantise_matrix", 11, "quantised_model", "dequantise_matrix",
        "The inverse of quantise_matrix: the (out, in) matrix its stored tensors stand for, in dtype.",
        "Unpack in the reverse order of quantise_matrix: unpack_int4 the codes, then call the dequantiser of "
        "the scheme's kind with scheme.group_size and dtype.",
        "For nf4 with double quantisation, rebuild the absmaxes first: DoubleQuantised(codes, scales, offset, "
        "(out, in // group_size), len(codes) // len(scales)).dequantise().",
        "if scheme.kind == 'int8': return dequantise_int8(*stored, dtype)\n"
        "if scheme.kind == 'int4': packed, s, z = stored; return dequantise_groups(unpack_int4(packed), s, z, scheme.group_size, dtype)\n"
        "...absmax (rebuilt when double_quant)...\n"
        "return dequantise_nf4(unpack_int4(packed), absmax, scheme.group_size, dtype)",
    ),
    exercise(
        "quantise_model", 11, "quantised_model", "quantise_model",
        "Make the model store each of its blocks' weight matrices quantised and dequantise it whenever its one "
        "forward pass reads it, without changing the model's code.",
        "torch.nn.utils.parametrize turns a parameter into a property computed from stored tensors: "
        "right_inverse stores (here: quantises), forward reads (dequantises). QuantisedWeight is that parametrisation.",
        "For each (module, name) in targets: parametrize.register_parametrization(module, name, "
        "QuantisedWeight(scheme, name, weight.shape)). The float weight is replaced by what right_inverse returns.",
        "parametrize.register_parametrization(module, name, QuantisedWeight(scheme, name, weight.shape))",
    ),
    exercise(
        "gptq_quantise", 11, "gptq", "gptq_quantise",
        "Optional (GPTQ's core): round the columns in order, and after each, move the columns not yet rounded so "
        "that the layer's output on the calibration inputs loses as little as possible.",
        "Rounding column j leaves an error e = w_j - dequantised q_j in every row. With U the upper Cholesky factor "
        "of the inverse Hessian (given: factor), the later columns absorb it: w[:, j+1:] -= e / U[j, j] * U[j, j+1:].",
        "Round with the group's scale and zero point exactly as quantise_groups does, measure the error against the "
        "DEQUANTISED code (q - zero_point) * scale, divide it by the pivot factor[j, j], and subtract (not add) "
        "its outer product with factor[j, j+1:].",
        "q = (torch.round(weight[:, j] / scale[:, g]) + zero_point[:, g]).clamp(0, top)\n"
        "error = (weight[:, j] - (q - zero_point[:, g]) * scale[:, g]) / factor[j, j]\n"
        "weight[:, j + 1:] -= error[:, None] * factor[j, j + 1:][None, :]\n"
        "codes[:, j] = q.to(torch.uint8)",
        optional=True,
    ),
)

_Q = "quantise.py"
_N = "nf4.py"
_M = "quantised_model.py"
_INT8_SCALE = "    scale = weight.abs().amax(dim=1) / INT8_MAX\n"
_INT8_CODES = "    q = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)\n"
_GROUPED = "    grouped = weight.reshape(weight.shape[0], n_groups, group_size)\n    low = "
_ZERO_POINT = "    zero_point = torch.round(-low / scale).clamp(0, top)\n"
_GROUP_CODES = "    q = (torch.round(grouped / scale[..., None]) + zero_point[..., None]).clamp(0, top)\n"
_DEQ_GROUPS = (
    "    grouped = q.reshape(q.shape[0], n_groups, group_size).to(torch.float32)\n"
    "    weight = (grouped - zero_point.to(torch.float32)[..., None]) * scale.to(torch.float32)[..., None]\n"
    "    return weight.reshape(q.shape).to(dtype)\n"
)
_NF4_CODES = "    codes = (normalised[..., None] - levels).abs().argmin(dim=-1)\n"
_NF4_DEQ = (
    "    values = levels[codes.long()].reshape(codes.shape[0], n_groups, group_size)\n"
    "    return (values * absmax.to(torch.float32)[..., None]).reshape(codes.shape).to(dtype)\n"
)

MISTAKES: list[Mistake] = [
    Mistake(11, "scale from the mean instead of the max", _Q, _INT8_SCALE,
            "    scale = weight.abs().mean(dim=1) / INT8_MAX\n",
            why="the scale is the row's mean magnitude over 127, so every weight larger than a few times the mean "
                "is clipped to +-127"),
    Mistake(11, "rounding before scaling", _Q, _INT8_CODES,
            "    q = (torch.round(weight) / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)\n",
            why="the weights are rounded to whole numbers before they are divided by the scale, which turns "
                "every weight below 0.5 into 0"),
    Mistake(11, "int8 dequantised in float32 whatever dtype asks", _Q,
            "    return (q.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)\n",
            "    return q.to(torch.float32) * scale.to(torch.float32)[:, None]\n",
            why="the dequantised weight comes back in float32 whatever dtype is asked for, so a bfloat16 model "
                "gets float32 weights"),
    Mistake(11, "groups across the wrong dimension", _Q, _GROUPED,
            "    grouped = weight.reshape(weight.shape[0], group_size, n_groups).transpose(1, 2)\n    low = ",
            why="a group is every n_groups-th input of the row (a stride across the row) instead of group_size "
                "consecutive inputs"),
    Mistake(11, "4-bit rounding before scaling", _Q, _GROUP_CODES,
            "    q = (torch.round(grouped) / scale[..., None] + zero_point[..., None]).clamp(0, top)\n",
            why="the weights are rounded to whole numbers before they are divided by the scale"),
    Mistake(11, "zero point off by one", _Q, _ZERO_POINT,
            "    zero_point = (torch.round(-low / scale) + 1).clamp(0, top)\n",
            why="the zero point is one more than the code of 0, round(-min / scale) + 1, so every code is "
                "shifted up by one step and the top of the range is clipped"),
    Mistake(11, "codes minus zero point in uint8 (wraps below zero)", _Q, _DEQ_GROUPS,
            "    grouped = q.reshape(q.shape[0], n_groups, group_size)\n"
            "    weight = (grouped - zero_point.to(torch.uint8)[..., None]).to(torch.float32) * scale.to(torch.float32)[..., None]\n"
            "    return weight.reshape(q.shape).to(dtype)\n",
            why="the zero point is subtracted from the codes in uint8, where a code below its zero point wraps "
                "around to a large positive number (the wrong dtype for the arithmetic)"),
    Mistake(11, "NF4 levels not scaled to [-1, 1]", _N, "    return (levels / levels.max()).to(torch.float32)\n",
            "    return levels.to(torch.float32)\n",
            why="the levels are the raw normal quantiles (up to about 1.85), not divided by the largest, so "
                "+-1 is not a level and a group's absmax does not map back to itself"),
    Mistake(11, "NF4 levels from evenly spaced probabilities up to 1 - 1/32 on both sides", _N,
            "    p = NF4_OUTER_PROBABILITY\n", "    p = 1 - 1 / 32\n",
            why="the outer probability is 1 - 1/32 instead of QLoRA's mean of 1 - 1/30 and 1 - 1/32, which "
                "moves every level"),
    Mistake(11, "NF4 code of the next level up, not the nearest", _N, _NF4_CODES,
            "    codes = torch.bucketize(normalised, levels).clamp(max=15)\n",
            why="each weight gets the first level at or above it (bucketize on the levels), not the nearest one"),
    Mistake(11, "NF4 dequantised in float16 whatever dtype asks", _N, _NF4_DEQ,
            "    values = levels[codes.long()].reshape(codes.shape[0], n_groups, group_size)\n"
            "    return (values * absmax.to(torch.float32)[..., None]).reshape(codes.shape).to(torch.float16)\n",
            why="the dequantised weight comes back in float16 whatever dtype is asked for"),
    Mistake(11, "double quantisation without the mean subtracted", _N,
            "    padded = torch.cat([flat - offset, flat.new_zeros(n_blocks * block_size - flat.numel())])\n",
            "    padded = torch.cat([flat, flat.new_zeros(n_blocks * block_size - flat.numel())])\n",
            why="the absmaxes are quantised as they are while the stored offset says their mean was subtracted, "
                "so every absmax comes back too large by that mean"),
    Mistake(11, "4-bit codes stored one per byte", _M, "        return pack_int4(q), scale, zero_point.to(torch.uint8)\n",
            "        return q, scale, zero_point.to(torch.uint8)\n",
            why="the int4 codes are stored one per uint8 instead of packed two per byte, so 4-bit weights take "
                "as many bytes as int8 ones"),
    Mistake(11, "GPTQ error added instead of subtracted", "gptq.py",
            "        weight[:, j + 1 :] -= error[:, None] * factor[j, j + 1 :][None, :]\n",
            "        weight[:, j + 1 :] += error[:, None] * factor[j, j + 1 :][None, :]\n",
            why="the rounding error is added to the later columns instead of subtracted, which doubles its effect "
                "on the output instead of cancelling it"),
    Mistake(11, "GPTQ error not divided by the pivot", "gptq.py",
            "        error = (weight[:, j] - (q - zero_point[:, g]) * scale[:, g]) / factor[j, j]\n",
            "        error = weight[:, j] - (q - zero_point[:, g]) * scale[:, g]\n",
            why="the rounding error is spread without dividing it by the Cholesky factor's pivot U[j, j], so "
                "the later columns move by the wrong amount"),
]

VARIANTS: list[Variant] = [
    Variant(11, "quantise_int8", "abs().max(dim=1).values over 127.0", _Q,
            _INT8_SCALE, "    scale = weight.abs().max(dim=1).values / 127.0\n"),
    Variant(11, "quantise_int8", "clamp in the float domain first, then round", _Q, _INT8_CODES,
            "    q = torch.clamp(weight / scale.unsqueeze(1), min=-127, max=127).round()\n"),
    Variant(11, "quantise_int8", "classic, written whole: no checks, in place on its own intermediates", _Q,
            "    weight = check_matrix(weight)\n" "    ### BEGIN SOLUTION\n"
            "    # Hint: the largest magnitude of each row maps to 127, so nothing is clipped.\n"
            + _INT8_SCALE + "    ### END SOLUTION\n"
            "    scale = scale.clamp(min=SMALLEST_SCALE)  # an all-zero row: codes 0, not 0 / 0\n",
            "    scale = weight.abs().max(dim=-1).values\n"
            "    scale /= 127\n"),
    Variant(11, "quantise_int8", "classic, in place on its own intermediates: div_, round_, clamp_", _Q, _INT8_CODES,
            "    q = weight.div_(scale[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)\n"),
    Variant(11, "quantise_groups", "classic, in place on the grouped view: div_, round_, add_, clamp_", _Q,
            _GROUP_CODES, "    q = grouped.div_(scale[..., None]).round_().add_(zero_point[..., None]).clamp_(0, top)\n"),
    Variant(11, "quantise_nf4", "classic, the group divided in place", _N,
            "    normalised = grouped / absmax[..., None]\n",
            "    normalised = grouped.div_(absmax[..., None])\n"),
    Variant(11, "double_quantise", "classic, the mean subtracted from flat in place", _N,
            "    padded = torch.cat([flat - offset, flat.new_zeros(n_blocks * block_size - flat.numel())])\n",
            "    flat -= offset\n"
            "    padded = torch.cat([flat, flat.new_zeros(n_blocks * block_size - flat.numel())])\n"),
    Variant(11, "dequantise_int8", "cast each operand to dtype, then multiply (rounded twice in bfloat16)", _Q,
            "    return (q.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)\n",
            "    return q.to(dtype) * scale.to(dtype).unsqueeze(-1)\n"),
    Variant(11, "quantise_groups", "einops rearrange and torch.aminmax", _Q,
            _GROUPED + "grouped.amin(dim=-1).clamp(max=0)\n    high = grouped.amax(dim=-1).clamp(min=0)\n",
            "    import einops\n"
            "    grouped = einops.rearrange(weight, 'o (g s) -> o g s', s=group_size)\n"
            "    low, high = torch.aminmax(grouped, dim=-1)\n"
            "    low, high = torch.minimum(low, torch.zeros_like(low)), torch.maximum(high, torch.zeros_like(high))\n"),
    Variant(11, "quantise_groups", "the zero point added before rounding, clamp in place", _Q,
            _GROUP_CODES + "    return q.reshape(weight.shape).to(torch.uint8), scale, zero_point\n",
            "    q = torch.round(grouped / scale[..., None] + zero_point[..., None])\n"
            "    q.clamp_(0, top)\n"
            "    return q.reshape(weight.shape).to(torch.uint8), scale, zero_point\n"),
    Variant(11, "dequantise_groups", "scales and zero points repeated to full rows", _Q, _DEQ_GROUPS,
            "    zeros = zero_point.float().repeat_interleave(group_size, dim=1)\n"
            "    scales = scale.float().repeat_interleave(group_size, dim=1)\n"
            "    return ((q.float() - zeros) * scales).to(dtype)\n"),
    Variant(11, "nf4_levels", "torch.distributions.Normal's icdf, built in a list", _N,
            "    positive = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])  # 8 values, without 0.5\n"
            "    negative = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])  # 7 values\n"
            "    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values\n",
            "    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))\n"
            "    values = [0.0]\n"
            "    values += normal.icdf(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1]).tolist()\n"
            "    values += (-normal.icdf(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])).tolist()\n"
            "    levels = torch.tensor(sorted(values), dtype=torch.float64)\n"),
    Variant(11, "quantise_nf4", "bucketize on the midpoints between levels", _N, _NF4_CODES,
            "    midpoints = (levels[1:] + levels[:-1]) / 2\n"
            "    codes = torch.bucketize(normalised, midpoints)\n"),
    Variant(11, "dequantise_nf4", "torch.take and absmax repeated to full rows", _N, _NF4_DEQ,
            "    values = torch.take(levels, codes.long())\n"
            "    return (values * absmax.float().repeat_interleave(group_size, dim=1)).to(dtype)\n"),
    Variant(11, "double_quantise", "the int8 absmax written out, in place", _N,
            "    codes, scales = quantise_int8(padded.reshape(n_blocks, block_size))\n",
            "    blocks = padded.reshape(n_blocks, block_size)\n"
            "    scales = blocks.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).smallest_normal) / 127\n"
            "    codes = blocks / scales[:, None]\n"
            "    codes.round_().clamp_(-127, 127)\n"
            "    codes = codes.to(torch.int8)\n"),
    Variant(11, "quantise_model", "register_parametrization with unsafe=True", _M,
            "        parametrize.register_parametrization(module, name, QuantisedWeight(scheme, name, weight.shape))\n",
            "        parametrize.register_parametrization(module, name, QuantisedWeight(scheme, name, weight.shape), unsafe=True)\n"),
    Variant(11, "quantise_matrix", "a match statement on the kind", _M,
            '    if scheme.kind == "int8":\n'
            "        return quantise_int8(matrix)\n"
            '    if scheme.kind == "int4":\n'
            "        q, scale, zero_point = quantise_groups(matrix, scheme.group_size, bits=4)\n"
            "        # Zero points are whole numbers in [0, 15]: one byte each, not a float's four.\n"
            "        return pack_int4(q), scale, zero_point.to(torch.uint8)\n",
            "    match scheme.kind:\n"
            '        case "int8":\n'
            "            q, scale = quantise_int8(matrix)\n"
            "            return q, scale\n"
            '        case "int4":\n'
            "            q, scale, zero_point = quantise_groups(matrix, scheme.group_size)\n"
            "            return pack_int4(q), scale, zero_point.to(torch.uint8)\n"),
    Variant(11, "dequantise_matrix", "the absmaxes rebuilt by hand", _M,
            "        absmax = DoubleQuantised(codes, scales, offset, groups, len(codes) // len(scales)).dequantise()\n",
            "        block = codes.numel() // scales.numel()\n"
            "        centred = codes.reshape(-1, block).float() * scales.float()[:, None]\n"
            "        absmax = (centred.flatten()[: groups[0] * groups[1]] + offset.float()).reshape(groups)\n"),
    Variant(11, "gptq_quantise", "the dequantised column first, the update with addr_", "gptq.py",
            "        error = (weight[:, j] - (q - zero_point[:, g]) * scale[:, g]) / factor[j, j]\n"
            "        weight[:, j + 1 :] -= error[:, None] * factor[j, j + 1 :][None, :]\n",
            "        dequantised = (q - zero_point[:, g]) * scale[:, g]\n"
            "        error = (weight[:, j] - dequantised) / factor[j, j]\n"
            "        rest = weight[:, j + 1 :]\n"
            "        rest.addr_(error, factor[j, j + 1 :], alpha=-1)\n"),
    # Second styles, so that every exercise has at least two.
    Variant(11, "dequantise_int8", "scale times q, type promotion giving float32", _Q,
            "    return (q.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)\n",
            "    product = scale.float().unsqueeze(1) * q\n"
            "    return product.to(dtype=dtype)\n"),
    Variant(11, "dequantise_groups", "einops rearrange both ways", _Q, _DEQ_GROUPS,
            "    import einops\n"
            "    grouped = einops.rearrange(q.float(), 'o (g s) -> o g s', s=group_size)\n"
            "    weight = (grouped - zero_point.float().unsqueeze(-1)) * scale.float().unsqueeze(-1)\n"
            "    return einops.rearrange(weight, 'o g s -> o (g s)').to(dtype)\n"),
    Variant(11, "nf4_levels", "the standard library's NormalDist", _N,
            "    positive = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])  # 8 values, without 0.5\n"
            "    negative = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])  # 7 values\n"
            "    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values\n",
            "    from statistics import NormalDist\n"
            "    normal = NormalDist()\n"
            "    positive = [normal.inv_cdf(p + (0.5 - p) * i / 8) for i in range(8)]\n"
            "    negative = [-normal.inv_cdf(p + (0.5 - p) * i / 7) for i in range(7)]\n"
            "    levels = torch.tensor(sorted(negative + [0.0] + positive), dtype=torch.float64)\n"),
    Variant(11, "quantise_nf4", "argmin of squared distances", _N, _NF4_CODES,
            "    codes = torch.argmin((normalised.unsqueeze(-1) - levels) ** 2, dim=-1)\n"),
    Variant(11, "dequantise_nf4", "index_select on the flattened codes", _N, _NF4_DEQ,
            "    values = levels.index_select(0, codes.flatten().long()).view(codes.shape[0], n_groups, group_size)\n"
            "    values = values * absmax.float().unsqueeze(-1)\n"
            "    return values.view(codes.shape).to(dtype)\n"),
    Variant(11, "double_quantise", "the mean subtracted in place, padded with F.pad", _N,
            "    offset = flat.mean()\n"
            "    padded = torch.cat([flat - offset, flat.new_zeros(n_blocks * block_size - flat.numel())])\n",
            "    offset = flat.mean()\n"
            "    centred = flat.clone()\n"
            "    centred -= offset\n"
            "    padded = torch.nn.functional.pad(centred, (0, n_blocks * block_size - flat.numel()))\n"),
    Variant(11, "quantise_matrix", "NF4 codes packed by hand", _M, "        return pack_int4(codes), absmax\n",
            "        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)\n"
            "        return packed, absmax\n"),
    Variant(11, "dequantise_matrix", "NF4 codes unpacked by hand", _M,
            "    return dequantise_nf4(unpack_int4(packed), absmax, scheme.group_size, dtype)\n",
            "    codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(1)\n"
            "    return dequantise_nf4(codes, absmax, scheme.group_size, dtype)\n"),
    Variant(11, "quantise_model", "keyword arguments, the shape read from the module", _M,
            "        parametrize.register_parametrization(module, name, QuantisedWeight(scheme, name, weight.shape))\n",
            "        parametrization = QuantisedWeight(scheme, name, module._parameters[name].shape)\n"
            "        parametrize.register_parametrization(module=module, tensor_name=name, parametrization=parametrization)\n"),
    Variant(11, "gptq_quantise", "clamp before rounding, the update with torch.outer", "gptq.py",
            "        q = (torch.round(weight[:, j] / scale[:, g]) + zero_point[:, g]).clamp(0, top)\n"
            "        error = (weight[:, j] - (q - zero_point[:, g]) * scale[:, g]) / factor[j, j]\n"
            "        weight[:, j + 1 :] -= error[:, None] * factor[j, j + 1 :][None, :]\n",
            "        q = torch.clamp(weight[:, j] / scale[:, g] + zero_point[:, g], 0, top).round()\n"
            "        error = (weight[:, j] - (q - zero_point[:, g]) * scale[:, g]) / factor[j, j]\n"
            "        weight[:, j + 1 :] -= torch.outer(error, factor[j, j + 1 :])\n"),
]

from sampling_course.grading.parts.part11_quantisation.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)

MISTAKES = with_fixes(MISTAKES, FIXES)
