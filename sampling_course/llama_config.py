"""The configuration of a Llama-style decoder (part 9), and its translation to and from Hugging Face's.

A Llama-style model differs from GPT-2 in four places: RMSNorm instead of LayerNorm, rotary
position embeddings instead of learned ones, fewer key/value heads than query heads
(grouped-query attention), and a gated MLP (SwiGLU); it has no biases. Qwen3 adds an RMSNorm
on every query and key head (``qk_norm``). The field names follow TransformerLens
(``n_key_value_heads``, ``rotary_base``, ``eps``) and part 1's ``Config`` where they mean the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sampling_course.config import Config

# Hugging Face model types this configuration describes, and whether each has q/k norms.
MODEL_TYPES = {"llama": False, "qwen3": True}


@dataclass
class LlamaConfig:
    """Hyperparameters of a Llama-style decoder; the defaults are a small test-sized model."""

    d_model: int = 64
    d_vocab: int = 128
    n_ctx: int = 256
    d_head: int = 16
    d_mlp: int = 160
    n_heads: int = 4
    n_key_value_heads: int = 2
    n_layers: int = 2
    eps: float = 1e-6
    rotary_base: float = 10000.0
    qk_norm: bool = False  # Qwen3's RMSNorm on each query and key head, before the rotation
    init_range: float = 0.02

    def __post_init__(self) -> None:
        for name in ("d_model", "d_vocab", "n_ctx", "d_head", "d_mlp", "n_heads", "n_key_value_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_key_value_heads:
            raise ValueError(f"LlamaConfig.n_heads ({self.n_heads}) must be a multiple of n_key_value_heads "
                             f"({self.n_key_value_heads}): each key/value head serves a group of query heads")
        if self.d_head % 2:
            raise ValueError(f"LlamaConfig.d_head must be even (rotary embeddings rotate pairs), got {self.d_head}")
        if not self.eps > 0 or not self.rotary_base > 0:
            raise ValueError(f"LlamaConfig.eps and rotary_base must be > 0, got {self.eps!r} and {self.rotary_base!r}")

    @property
    def model_type(self) -> str:
        """The Hugging Face architecture with these features: ``"qwen3"`` with q/k norms, else ``"llama"``."""
        return "qwen3" if self.qk_norm else "llama"

    def cache_config(self) -> "Config":
        """The GPT-2 ``Config`` whose caches fit this model: part 4's and part 6's caches take their shape
        (n_layers, 2, batch, pos, n_heads, d_head) from a ``Config``, and a layer here caches its
        ``n_key_value_heads`` key/value heads only. Also what part 5's engine reads (d_vocab, n_ctx)."""
        from sampling_course.config import Config

        return Config(d_model=self.d_model, debug=False, d_vocab=self.d_vocab, n_ctx=self.n_ctx, d_head=self.d_head,
                      d_mlp=self.d_mlp, n_heads=self.n_key_value_heads, n_layers=self.n_layers)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hf_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``LlamaConfig``/``Qwen3Config`` of transformers describing the same model."""
        return dict(
            vocab_size=self.d_vocab, hidden_size=self.d_model, intermediate_size=self.d_mlp,
            num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_key_value_heads, head_dim=self.d_head, max_position_embeddings=self.n_ctx,
            rms_norm_eps=self.eps, rope_parameters={"rope_type": "default", "rope_theta": float(self.rotary_base)},
            hidden_act="silu", attention_bias=False, tie_word_embeddings=False, initializer_range=self.init_range,
        )

    @classmethod
    def from_hf(cls, hf_config: Any) -> "LlamaConfig":
        """Translate a transformers ``LlamaConfig`` or ``Qwen3Config``.

        Only what the course's model computes is accepted: default rotary embeddings (no
        Llama-3 frequency scaling), no biases, SiLU, full attention in every layer.
        """
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"LlamaConfig.from_hf takes a {' or '.join(MODEL_TYPES)} config, got model_type={model_type!r}")
        rope = getattr(hf_config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"only default rotary embeddings are supported, got rope_type={rope.get('rope_type')!r}")
        if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
            raise ValueError("a Llama-style model with biases is not supported (attention_bias and mlp_bias must be False)")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"the gated MLP uses SiLU, got hidden_act={hf_config.hidden_act!r}")
        if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", False):
            raise ValueError("sliding-window attention layers are not supported")
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        return cls(
            d_model=hf_config.hidden_size, d_vocab=hf_config.vocab_size, n_ctx=hf_config.max_position_embeddings,
            d_head=head_dim, d_mlp=hf_config.intermediate_size, n_heads=hf_config.num_attention_heads,
            n_key_value_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
            n_layers=hf_config.num_hidden_layers, eps=hf_config.rms_norm_eps,
            rotary_base=float(rope.get("rope_theta", 10000.0)), qk_norm=MODEL_TYPES[model_type],
            init_range=getattr(hf_config, "initializer_range", 0.02),
        )
