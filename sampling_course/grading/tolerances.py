"""How close two correct implementations' numbers are, per device and dtype: the one place tests read it.

Two correct implementations of the same float computation differ by rounding only: the
order of a sum, a fused kernel instead of two, another matmul algorithm. How much depends
on the dtype and, less, on the device. The grading suites compare logits (and the
activations that lead to them) with ``torch.testing.assert_close(..., **parity())``; the
values below are the bounds, with why each is what it is.

* float32, CPU: ``atol = rtol = 1e-4``. Measured on the course's references: the solutions
  and TransformerLens / Hugging Face agree to about 2e-5 at the stand-in's logit scale
  (about 25) and every classic mistake moves logits by far more than 1e-3.
* float32, CUDA: the same bounds, with TF32 off. Since Ampere, torch may run float32
  matmuls in TF32 (10-bit mantissa, about 1e-3 relative error); the pytest plugin sets
  full float32 precision for the session (``devices.full_fp32_precision``), as Hugging
  Face's own tests do, and then cuBLAS differs from a CPU library by summation order only.
* float32, MPS: the same bounds; Apple's float32 kernels are full float32 too. (Still to be
  confirmed on an Apple machine; loosen here, and only here, if they are not.)
* bfloat16 (8-bit mantissa, unit roundoff 2^-8 = 0.4%) and float16 (11-bit, 2^-11): every
  product and sum rounds at that precision, and a GPT-2 layer's errors add up along its
  residual stream. Measured on the CPU, the solutions' DemoTransformer in bfloat16 gives
  logits within 0.72 of Hugging Face's float32 logits on the stand-in "tiny" (logits up to
  25) and within 0.21 on "story"; in float16 within 0.075 and 0.026. The bounds leave room
  for other kernels: bfloat16 ``atol = 1.0, rtol = 5e-2``, float16 ``atol = 0.1, rtol = 1e-2``.
  Such bounds cannot tell a subtle mistake from rounding, so the course grades in float32;
  they are for comparing a half-precision path with a float32 reference (the GPU bench,
  notebooks).
"""

from __future__ import annotations

import torch

# (device type, dtype) -> tolerances for torch.testing.assert_close; see the module docstring.
_FLOAT32 = dict(atol=1e-4, rtol=1e-4)
TOLERANCES: dict[tuple[str, torch.dtype], dict[str, float]] = {
    ("cpu", torch.float32): _FLOAT32,
    ("cuda", torch.float32): _FLOAT32,
    ("mps", torch.float32): _FLOAT32,
}
HALF = {torch.bfloat16: dict(atol=1.0, rtol=5e-2), torch.float16: dict(atol=0.1, rtol=1e-2)}


def parity(device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """``atol`` and ``rtol`` for comparing logits (or activations) of two correct implementations
    computed on ``device`` (the course's device when None) in ``dtype``."""
    from sampling_course.devices import parse_device, pick_device

    kind = pick_device().type if device is None else parse_device(device).type
    if dtype in HALF:
        return dict(HALF[dtype])
    try:
        return dict(TOLERANCES[kind, dtype])
    except KeyError:
        raise ValueError(f"no tolerance is stated for {dtype} on {kind}; add one to grading/tolerances.py") from None
