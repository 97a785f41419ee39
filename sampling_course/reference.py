"""Reference models: the real GPT-2 small, or an offline stand-in with the same architecture.

Every test in the course compares the learner's code with these references, computed
live on the same weights:

* ``model``: a TransformerLens ``TransformerBridge`` in compatibility mode, whose
  ``run_with_cache`` gives every intermediate activation (``cache["normalized", 0, "ln1"]``).
  It is built the first time it is used, since loading TransformerLens takes seconds.
* ``hf_model``: the Hugging Face ``GPT2LMHeadModel``, for logits and ``generate``.

The checkpoints:

* ``"gpt2"``: GPT-2 small from the Hugging Face hub (or its local cache when offline).
* ``"story"`` and ``"story-draft"``: small GPT-2s trained on the course's story source
  (``sampling_course.stories``), shipped with the course. Their text reads as (simple)
  English, and the exact probabilities of the source tell how good they are.
* ``"tiny"``: a small GPT-2 with deterministic weights and a byte-level BPE tokenizer
  trained on text shipped with the course. It is built on first use, saved to a local
  directory, and loaded back exactly the way the hub checkpoint is, so both references
  go through the same code.

All of them load through the same code as the hub checkpoint. ``"auto"`` picks the real
GPT-2 when it is available and the story model otherwise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import torch

from sampling_course.config import Config

GPT2_REPO_IDS = ("openai-community/gpt2", "gpt2")
# Only what loading needs: no TF/Flax/ONNX weights.
GPT2_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
]

# The stand-in's recipe. Bump TINY_VERSION whenever the recipe changes, so that a
# checkpoint built by an older recipe is never picked up from the cache.
TINY_VERSION = 1
TINY_SEED = 20240607
TINY_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_inner=256, n_positions=128)


class ReferenceUnavailable(RuntimeError):
    """The requested reference model cannot be loaded on this machine."""


@dataclass(frozen=True)
class Reference:
    """A loaded reference checkpoint. Shared between callers: do not modify its models.

    ``model`` (the TransformerLens bridge) is built the first time it is read: loading
    TransformerLens takes seconds, and only the tests that compare activations need it.
    """

    name: str
    hf_model: "object"  # transformers.GPT2LMHeadModel, in eval mode
    tokenizer: "object"  # transformers.GPT2TokenizerFast
    cfg: Config
    path: Path
    # Builds the bridge on first access to ``model``; not part of the value.
    _build_model: Callable[[], object] = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    _lock: threading.Lock = field(repr=False, compare=False, default_factory=threading.Lock)

    @property
    def model(self) -> "object":  # transformer_lens.model_bridge.TransformerBridge
        """A TransformerLens ``TransformerBridge`` on the same weights, built on first use."""
        with self._lock:  # two threads reading it at once build it once
            if "_model" not in self.__dict__:
                if self._build_model is None:
                    raise ReferenceUnavailable(f"reference {self.name!r} was created without a TransformerLens model")
                # Writing __dict__ directly: a frozen dataclass forbids attribute assignment.
                self.__dict__["_model"] = self._build_model()
            return self.__dict__["_model"]

    @property
    def model_loaded(self) -> bool:
        """Whether ``model`` has been built already (reading it would build it)."""
        return "_model" in self.__dict__


def cache_home() -> Path:
    """Where the course keeps what it builds (override with SAMPLING_COURSE_HOME)."""
    env = os.environ.get("SAMPLING_COURSE_HOME")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sampling-course"
    base.mkdir(parents=True, exist_ok=True)
    return base


# ---------------------------------------------------------------------------------------
# Finding GPT-2 small
# ---------------------------------------------------------------------------------------


def gpt2_local_dir() -> Path | None:
    """The directory of a GPT-2 small snapshot in the local Hugging Face cache, if any."""
    from huggingface_hub import snapshot_download

    for repo_id in GPT2_REPO_IDS:
        try:
            path = Path(snapshot_download(repo_id, allow_patterns=GPT2_FILES, local_files_only=True))
        except Exception:  # not cached under this name
            continue
        if (path / "config.json").exists() and (path / "model.safetensors").exists():
            return path
    return None


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick connectivity probe, so that offline machines do not wait on retries."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def download_gpt2() -> Path:
    """Download GPT-2 small into the local Hugging Face cache and return its directory."""
    from huggingface_hub import snapshot_download

    if not hub_reachable():
        raise ReferenceUnavailable(
            "Cannot reach the Hugging Face hub to download GPT-2 small. Run "
            "`sampling-course download-gpt2` on a machine with internet access and copy "
            "~/.cache/huggingface/hub/models--openai-community--gpt2 here, or use the "
            "offline stand-in: load_reference('tiny')."
        )
    return Path(snapshot_download(GPT2_REPO_IDS[0], allow_patterns=GPT2_FILES))


def _gpt2_dir(allow_download: bool) -> Path:
    local = gpt2_local_dir()
    if local is not None:
        return local
    if allow_download and hub_reachable():
        return download_gpt2()
    raise ReferenceUnavailable(
        "GPT-2 small is not in the local Hugging Face cache"
        + (" and the hub is unreachable" if allow_download else "")
        + ". Get the weights once with `sampling-course download-gpt2` (needs internet), "
        "or use the offline stand-in: load_reference('tiny')."
    )


# ---------------------------------------------------------------------------------------
# Building the offline stand-in
# ---------------------------------------------------------------------------------------


def _perturb_(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter with deterministic random values.

    Every bias and every LayerNorm weight moves away from Hugging Face's 0 / 1 defaults,
    so a model that forgets a bias or LayerNorm's w and b cannot match the reference.
    The embedding and the final LayerNorm are scaled up so that next-token
    distributions are peaked (a few likely tokens), as in a trained model.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Sorted names make the draw order, hence the weights, independent of module order.
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("wte.weight"):
                param.copy_(0.3 * noise)
            elif name.endswith("wpe.weight"):
                param.copy_(0.3 * noise)
            elif name.endswith("ln_f.weight"):
                param.copy_(2.0 * (1.0 + 0.2 * noise))
            elif ".ln_" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(0.2 * noise)


def build_tiny_checkpoint(out_dir: Path) -> None:
    """Build the stand-in GPT-2 and save it, with its tokenizer, like a hub checkpoint."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from sampling_course.tokenizer import load_tiny_tokenizer

    quiet_transformers()  # no "Writing model shards" bar: the build is a detail of the first run
    tokenizer = load_tiny_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **TINY_DIMS,
    )
    torch.manual_seed(TINY_SEED)  # the constructor's own init is overwritten, but keep it tidy
    model = GPT2LMHeadModel(config)
    _perturb_(model, TINY_SEED)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_dir() -> Path:
    """The stand-in's checkpoint directory, built on first use."""
    from sampling_course.tokenizer import TOKENIZER_DIR

    # The tokenizer's hash is part of the name: a retrained tokenizer means a new model.
    tok_hash = hashlib.sha256((Path(TOKENIZER_DIR) / "tokenizer.json").read_bytes()).hexdigest()[:10]
    target = cache_home() / f"tiny-gpt2-v{TINY_VERSION}-{tok_hash}"
    if not (target / "model.safetensors").exists():
        # Build next to the target and rename, so parallel processes never see half a checkpoint.
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            build_tiny_checkpoint(tmp)
            try:
                tmp.rename(target)
            except OSError:  # another process won the race; its copy is identical
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


def quiet_transformers() -> None:
    """Silence transformers' info logs and progress bars (loading and saving are details here)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _bridge(path: Path, tokenizer: object) -> object:
    """A TransformerLens bridge around a fresh copy of the checkpoint at ``path``."""
    from transformers import GPT2LMHeadModel
    from transformer_lens.model_bridge import TransformerBridge

    quiet_transformers()
    # The bridge rewires the module it is given in place, so it gets a copy of its own and
    # hf_model stays a plain GPT2LMHeadModel.
    bridged = GPT2LMHeadModel.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(path), hf_model=bridged, tokenizer=tokenizer)
        # no_processing: keep LayerNorm unfolded and the weights uncentred, exactly as
        # DemoTransformer holds them, so activations can be compared one for one.
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    bridge.eval()
    return bridge


@cache
def _load(name: str, path: Path) -> Reference:
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

    quiet_transformers()
    # float32 always: the story checkpoints are stored in float16 to keep the package
    # small, and from_pretrained would otherwise keep the stored dtype.
    hf_model = GPT2LMHeadModel.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    tokenizer = GPT2TokenizerFast.from_pretrained(path, local_files_only=True)
    return Reference(
        name=name,
        hf_model=hf_model,
        tokenizer=tokenizer,
        cfg=Config.from_hf(hf_model.config),
        path=path,
        _build_model=lambda: _bridge(path, tokenizer),
    )


STORY_MODELS = ("story", "story-draft")


def story_model_dir(name: str) -> Path:
    """The shipped directory of a story model (``"story"`` or ``"story-draft"``)."""
    from sampling_course.tokenizer import ASSETS_DIR

    if name not in STORY_MODELS:
        raise ValueError(f"unknown story model {name!r}; choose one of {STORY_MODELS}")
    path = ASSETS_DIR / name
    if not (path / "model.safetensors").is_file():
        raise ReferenceUnavailable(
            f"The {name!r} checkpoint is missing from {path}. "
            "Retrain it with: python scripts/train_story_models.py"
        )
    return path


def load_reference(
    name: Literal["auto", "gpt2", "story", "story-draft", "tiny"] = "auto", *, quiet: bool = False
) -> Reference:
    """Load a reference checkpoint by name: ``"gpt2"``, ``"story"``, ``"story-draft"``, ``"tiny"`` or ``"auto"``.

    ``"gpt2"`` uses the local Hugging Face cache, downloading once when the hub is
    reachable, and raises ``ReferenceUnavailable`` (saying how to get the weights)
    otherwise. ``"story"`` and ``"story-draft"`` are the models trained on the course's
    story source, shipped with the course. ``"auto"`` falls back to ``"story"`` with a
    visible notice. The result is cached per process and shared: treat its models as
    read-only.
    """
    if name == "tiny":
        return _load("tiny", tiny_dir())
    if name in STORY_MODELS:
        return _load(name, story_model_dir(name))
    if name == "gpt2":
        return _load("gpt2", _gpt2_dir(allow_download=True))
    if name == "auto":
        try:
            return load_reference("gpt2")
        except ReferenceUnavailable as exc:
            if not quiet:
                from rich.console import Console

                Console(stderr=True).print(
                    f"[yellow]Notice:[/] real GPT-2 unavailable ({exc}). "
                    "Using the offline story model 'story' instead."
                )
            return load_reference("story")
    raise ValueError(
        f"unknown reference {name!r}; choose 'auto', 'gpt2', 'story', 'story-draft' or 'tiny'"
    )
