"""The model configuration shared by every part of the course."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Config:
    """Hyperparameters of a GPT-2-style transformer, with GPT-2 small as the default.

    The field names are the ones TransformerLens uses, so a learner can move between
    this course and TransformerLens without translating.
    """

    d_model: int = 768
    debug: bool = True
    layer_norm_eps: float = 1e-5
    d_vocab: int = 50257
    init_range: float = 0.02
    n_ctx: int = 1024
    d_head: int = 64
    d_mlp: int = 3072
    n_heads: int = 12
    n_layers: int = 12

    def __post_init__(self) -> None:
        for name in ("d_model", "d_vocab", "n_ctx", "d_head", "d_mlp", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Config.{name} must be a positive integer, got {value!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"Config.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")

    @classmethod
    def from_hf(cls, hf_config: Any, debug: bool = False) -> "Config":
        """Translate a Hugging Face ``GPT2Config`` into the course's field names."""
        if getattr(hf_config, "model_type", "gpt2") != "gpt2":
            raise ValueError(
                f"Config.from_hf expects a GPT2Config, got model_type={hf_config.model_type!r}"
            )
        if hf_config.n_embd % hf_config.n_head != 0:
            raise ValueError(
                f"n_embd={hf_config.n_embd} is not divisible by n_head={hf_config.n_head}"
            )
        return cls(
            d_model=hf_config.n_embd,
            debug=debug,
            layer_norm_eps=hf_config.layer_norm_epsilon,
            d_vocab=hf_config.vocab_size,
            init_range=hf_config.initializer_range,
            n_ctx=hf_config.n_positions,
            d_head=hf_config.n_embd // hf_config.n_head,
            # GPT-2 leaves n_inner unset and uses the usual 4x expansion.
            d_mlp=hf_config.n_inner if hf_config.n_inner is not None else 4 * hf_config.n_embd,
            n_heads=hf_config.n_head,
            n_layers=hf_config.n_layer,
        )
