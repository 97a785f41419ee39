"""How to put right each of part 11's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "scale from the mean instead of the max": "take each row's largest magnitude: weight.abs().amax(dim=1) / 127",
    "rounding before scaling": "divide by the scale first, then round: torch.round(weight / scale[:, None])",
    "int8 dequantised in float32 whatever dtype asks": "end with .to(dtype) after multiplying in float32",
    "groups across the wrong dimension":
        "view each row as (n_groups, group_size): weight.reshape(out, n_groups, group_size), consecutive inputs",
    "4-bit rounding before scaling": "round the quotient: torch.round(grouped / scale[..., None]) + zero_point",
    "zero point off by one": "the zero point is the code of 0 itself: torch.round(-low / scale)",
    "codes minus zero point in uint8 (wraps below zero)":
        "convert the codes to float32 first, then subtract the zero point and multiply by the scale",
    "NF4 levels not scaled to [-1, 1]": "divide the sorted levels by their largest value, levels.max()",
    "NF4 levels from evenly spaced probabilities up to 1 - 1/32 on both sides":
        "use QLoRA's outer probability, the mean of 1 - 1/30 and 1 - 1/32 (NF4_OUTER_PROBABILITY)",
    "NF4 code of the next level up, not the nearest":
        "pick the level at the smallest distance: (normalised[..., None] - levels).abs().argmin(-1)",
    "NF4 dequantised in float16 whatever dtype asks": "cast the float32 result to the dtype argument: .to(dtype)",
    "double quantisation without the mean subtracted":
        "quantise flat - offset (the absmaxes minus their mean), the offset DoubleQuantised adds back",
    "4-bit codes stored one per byte": "store pack_int4(q), two codes per byte, and unpack_int4 them when reading",
    "GPTQ error added instead of subtracted": "subtract it: weight[:, j + 1:] -= error[:, None] * factor[j, j + 1:]",
    "GPTQ error not divided by the pivot": "divide the error by factor[j, j] before spreading it over the later columns",
}
