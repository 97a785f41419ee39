"""The Llama-style story model (part 9): ``load_reference("story-llama")``.

"story-llama" is a small ``LlamaForCausalLM`` (RMSNorm, rotary positions, grouped-query
attention, SwiGLU) trained on the course's story source like the GPT-2 story models, with the
same tokenizer, so that its held-out loss can be set against the same entropy floor
(``scripts/train_story_llama.py`` trains it; ``training.json`` in its folder holds the run's
figures). It ships with the course and its files are checked against the asset manifest.
"story-llama-sink" is the same model fine-tuned with a sink token, ``<|sink|>``, at position 0
of every training window (``scripts/train_story_llama.py --sink``): its tokenizer is the story
tokenizer plus that one token, whose id follows every other.

A ``LlamaReference`` has what a part 9 test or lesson needs: the ``LlamaConfig``, the
tokenizer, the weights in the course's names (``weights``, for ``LlamaTransformer``) and in
Hugging Face's (``hf_weights``), and Hugging Face's model itself (``hf_model``), built on
first use.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sampling_course.files import BrokenCourseFile, check_assets
from sampling_course.llama_config import LlamaConfig
from sampling_course.tokenizer import ASSETS_DIR, Tokenizer

if TYPE_CHECKING:
    import torch

LLAMA_STORY_MODELS = ("story-llama", "story-llama-sink")
REBUILD = {"story-llama": "python scripts/train_story_llama.py",
           "story-llama-sink": "python scripts/train_story_llama.py --sink"}


@dataclass(frozen=True)
class LlamaReference:
    """A loaded Llama-style checkpoint. Shared between callers: do not modify its model or tensors."""

    name: str
    cfg: LlamaConfig
    tokenizer: Tokenizer
    path: Path
    digest: str  # a SHA-256 over the checkpoint's config and weights, from the manifest
    device: "torch.device"
    dtype: "torch.dtype"
    _lock: threading.RLock = field(repr=False, compare=False, default_factory=threading.RLock)

    def _lazy(self, key: str, build):
        with self._lock:
            if key not in self.__dict__:
                self.__dict__[key] = build()  # a frozen dataclass forbids attribute assignment
            return self.__dict__[key]

    @property
    def hf_weights(self) -> dict[str, "torch.Tensor"]:
        """The checkpoint's tensors under Hugging Face's names, float32 on the CPU."""
        return self._lazy("_hf_weights", lambda: read_weights(self.path))

    @property
    def weights(self) -> dict[str, "torch.Tensor"]:
        """The same tensors in the course's names and shapes (``LlamaTransformer``'s state dict)."""
        from sampling_course.llama_weights import llama_state_dict

        return self._lazy("_weights", lambda: llama_state_dict(self.hf_weights, self.cfg))

    @property
    def hf_model(self) -> "object":  # transformers.LlamaForCausalLM, in eval mode
        """Hugging Face's ``LlamaForCausalLM`` on these weights (on ``device`` in ``dtype``), built on first use."""
        return self._lazy("_hf_model", lambda: hf_llama_model(self.path, self.device, self.dtype))


def llama_model_dir(name: str) -> Path:
    """The shipped folder of a Llama-style story model, checked against the asset manifest."""
    if name not in LLAMA_STORY_MODELS:
        raise ValueError(f"unknown Llama-style model {name!r}; choose one of {LLAMA_STORY_MODELS}")
    path = ASSETS_DIR / name
    check_assets(path, rebuild=REBUILD[name])
    return path


def llama_settings(name: str) -> tuple[LlamaConfig, Tokenizer]:
    """A Llama-style story model's configuration and tokenizer, without torch or its weights."""
    return settings_of(llama_model_dir(name))


@cache
def settings_of(path: Path) -> tuple[LlamaConfig, Tokenizer]:
    from types import SimpleNamespace

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BrokenCourseFile(f"the checkpoint's file {path / 'config.json'} cannot be read ({exc})") from None
    return LlamaConfig.from_hf(SimpleNamespace(**raw)), Tokenizer(path)


def read_weights(path: Path) -> dict[str, "torch.Tensor"]:
    from safetensors.torch import load

    tensors = load((path / "model.safetensors").read_bytes())
    # float32 always: the checkpoint is stored in float16 to keep the package small.
    return {name: t.float() if t.is_floating_point() else t for name, t in tensors.items()}


def hf_llama_model(path: Path, device: "torch.device", dtype: "torch.dtype") -> object:
    import transformers
    from transformers import LlamaForCausalLM

    transformers.utils.logging.set_verbosity_error()  # loading is a detail here
    transformers.utils.logging.disable_progress_bar()
    return LlamaForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).to(device).eval()


def load_llama_reference(name: str, device: "torch.device", dtype: "torch.dtype") -> LlamaReference:
    """Load a Llama-style story model (``load_reference`` calls this for its names; use that)."""
    path = llama_model_dir(name)
    listed = check_assets(path)
    digest = hashlib.sha256()
    for file in ("config.json", "model.safetensors"):
        digest.update(f"{file}:{listed[file]['sha256']}\n".encode())
    return loaded(name, path, digest.hexdigest(), device, dtype)


@cache
def loaded(name: str, path: Path, digest: str, device: "torch.device", dtype: "torch.dtype") -> LlamaReference:
    cfg, tokenizer = settings_of(path)
    return LlamaReference(name=name, cfg=cfg, tokenizer=tokenizer, path=path, digest=digest, device=device,
                          dtype=dtype)
