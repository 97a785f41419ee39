# GENERATED from solutions/gptq.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 3153188852db6ea7437826328c01ae36042e863394ea55d0d7b98b37876b83a2
"""Part 11 (optional): rounding that compensates its own error, the core of GPTQ (Frantar et al., 2022).

Rounding each weight to its nearest code (``quantise_groups``) minimises the error of each weight
on its own. What the model cares about is the error of the layer's OUTPUT on the inputs it sees,
``|| X W^T - X Wq^T ||^2`` over calibration inputs ``X`` (n, in). Inputs are correlated: when
column j of W is rounded up a little, the columns not yet rounded can move to cancel that error
in the output. Optimal Brain Quantisation gives the move, from the inverse of the Hessian of that
squared error, ``H = 2 X^T X`` (in, in): rounding column j with error ``e = w_j - q_j`` (each row
its own), the best change of the remaining columns is ``-e * Hinv[j, j+1:] / Hinv[j, j]``, and
the next column then works on the inverse Hessian with column j eliminated.

GPTQ's observation: the order does not matter much, so every row can go column by column in the
same order; then the eliminated inverse Hessians are the rows of one Cholesky factor. With
``U = cholesky(H^-1, upper=True)``, column j's update is ``-e / U[j, j] * U[j, j+1:]``. That is all
this file does; GPTQ adds lazy batched updates (for speed on a GPU) and a few refinements.

Groups: a group's scale and zero point are chosen (as ``quantise_groups`` does) from the group's
weights as they are when the group's first column is reached, i.e. after the earlier groups'
compensation has moved them, as GPTQ does with its group size.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, UInt8
from torch import Tensor

from .quantise import check_group_size, check_matrix, quantise_groups

# GPTQ's damping: 1% of the mean diagonal of H added to its diagonal, so that an input direction the
# calibration data never excites (a zero eigenvalue) does not make H singular.
DAMPING = 0.01


def gptq_quantise(
    weight: Float[Tensor, "out in"], inputs: Float[Tensor, "n in"], group_size: int, bits: int = 4
) -> tuple[UInt8[Tensor, "out in"], Float[Tensor, "out groups"], Float[Tensor, "out groups"]]:
    """``quantise_groups``'s triple (codes, scale, zero_point), rounding the columns in order and moving the
    columns not yet rounded to cancel each rounding error on the calibration ``inputs``."""
    weight = check_matrix(weight)  # a copy (check_matrix's): the columns not yet rounded are updated in place
    inputs = check_matrix(inputs, "inputs")
    n_groups = check_group_size(weight, group_size)
    if inputs.shape[1] != weight.shape[1]:
        raise ValueError(f"inputs must have the weight's {weight.shape[1]} input features, got {inputs.shape[1]}")
    top = 2**bits - 1
    hessian = 2 * inputs.double().T @ inputs.double()
    hessian += DAMPING * hessian.diagonal().mean().clamp(min=1e-12) * torch.eye(weight.shape[1], dtype=torch.float64, device=hessian.device)
    # The upper Cholesky factor of H^-1: row j is column j's update, with earlier columns eliminated.
    factor = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True).float()
    codes = torch.empty_like(weight, dtype=torch.uint8)
    scale = weight.new_empty(weight.shape[0], n_groups)
    zero_point = weight.new_empty(weight.shape[0], n_groups)
    for j in range(weight.shape[1]):
        g = j // group_size
        if j % group_size == 0:  # the group's scale and zero point, from its weights as they are now
            _, scale[:, g], zero_point[:, g] = (t[:, 0] for t in quantise_groups(weight[:, j : j + group_size], group_size, bits))
        # Hint: round column j with its group's scale and zero point, then spread its error over the later columns.
        raise NotImplementedError()
    return codes, scale, zero_point
