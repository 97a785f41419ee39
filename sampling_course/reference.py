"""Reference models: the real GPT-2 small, or an offline stand-in with the same architecture.

Every test in the course compares the learner's code with these references, computed
live on the same weights:

* ``model``: a TransformerLens ``TransformerBridge`` in compatibility mode, whose
  ``run_with_cache`` gives every intermediate activation (``cache["normalized", 0, "ln1"]``).
* ``hf_model``: the Hugging Face ``GPT2LMHeadModel``, for logits and ``generate``.

Both are built the first time they are used: importing transformers and TransformerLens
takes seconds, and a model built from the course's own code needs only the checkpoint's
tensors (``weights``), its ``cfg`` and the ``tokenizer``, which load without them.

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

Each loads on a device and in a dtype: by default the course's device
(``sampling_course.devices.pick_device``: a GPU when there is one) and float32.
``reference_settings(name)`` gives a checkpoint's ``Config`` and tokenizer without
importing torch, for a command to check its arguments first.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Literal

from sampling_course.config import Config
from sampling_course.files import BrokenCourseFile, cache_home, cached_folder, check_assets, read_manifest, sha256_of
from sampling_course.llama_reference import LLAMA_STORY_MODELS, load_llama_reference, llama_settings
from sampling_course.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads when a model or tensor is built, not to find a checkpoint and its settings
    import torch

__all__ = ["Reference", "ReferenceUnavailable", "cache_home", "download_gpt2", "gpt2_local_dir", "load_reference",
           "reference_settings", "story_model_dir", "tiny_dir"]

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
# checkpoint built by an older recipe is never picked up from the cache (2: the folder
# carries a manifest).
TINY_VERSION = 2
TINY_SEED = 20240607
TINY_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_inner=256, n_positions=128)


class ReferenceUnavailable(RuntimeError):
    """The requested reference model cannot be loaded on this machine."""


@dataclass(frozen=True)
class Reference:
    """A loaded reference checkpoint. Shared between callers: do not modify its models or tensors.

    ``hf_model`` and ``model`` (the TransformerLens bridge) are built the first time they
    are read; ``weights``, ``cfg`` and ``tokenizer`` need neither transformers nor
    TransformerLens. ``digest`` identifies the weights (a SHA-256 over the checkpoint's
    files), so that outputs computed on them can be stored and found again.
    """

    name: str
    cfg: Config
    tokenizer: Tokenizer  # the course's GPT-2 tokenizer (the same ids and text as GPT2TokenizerFast)
    path: Path
    digest: str
    device: "torch.device"  # where both models' weights live
    dtype: "torch.dtype"
    _lock: threading.RLock = field(repr=False, compare=False, default_factory=threading.RLock)

    def _lazy(self, key: str, build):
        with self._lock:  # two threads reading it at once build it once
            if key not in self.__dict__:
                # Writing __dict__ directly: a frozen dataclass forbids attribute assignment.
                self.__dict__[key] = build()
            return self.__dict__[key]

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under Hugging Face's names, in float32 on the CPU, read straight from its file."""
        return self._lazy("_weights", lambda: _read_weights(self.path))

    @property
    def hf_model(self) -> "object":  # transformers.GPT2LMHeadModel, in eval mode
        """The Hugging Face ``GPT2LMHeadModel`` on these weights (on ``device`` in ``dtype``, eval mode), built on first use."""
        return self._lazy("_hf_model", lambda: _hf_model(self.path, self.device, self.dtype))

    @property
    def hf_tokenizer(self) -> "object":  # transformers.GPT2TokenizerFast
        """The same tokenizer as a Hugging Face ``GPT2TokenizerFast`` (``generate(stop_strings=...)`` wants one)."""
        return self._lazy("_hf_tokenizer", lambda: _hf_tokenizer(self.path))

    @property
    def model(self) -> "object":  # transformer_lens.model_bridge.TransformerBridge
        """A TransformerLens ``TransformerBridge`` on the same weights, built on first use."""
        return self._lazy("_model", lambda: _bridge(self.path, self.hf_tokenizer, self.device, self.dtype))

    @property
    def model_loaded(self) -> bool:
        """Whether ``model`` has been built already (reading it would build it)."""
        return "_model" in self.__dict__

    @property
    def hf_model_loaded(self) -> bool:
        """Whether ``hf_model`` has been built already."""
        return "_hf_model" in self.__dict__


# ---------------------------------------------------------------------------------------
# Finding GPT-2 small
# ---------------------------------------------------------------------------------------


def _hub_cache() -> Path:
    """The Hugging Face hub cache folder, found as huggingface_hub finds it (without importing it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home) / "hub"


def gpt2_local_dir() -> Path | None:
    """The directory of a GPT-2 small snapshot in the local Hugging Face cache, if any."""
    # Importing huggingface_hub takes a noticeable part of a quick check: look for the folder first.
    names = [f"models--{repo_id.replace('/', '--')}" for repo_id in GPT2_REPO_IDS]
    if not any((_hub_cache() / name).is_dir() for name in names):
        return None
    from huggingface_hub import snapshot_download

    for repo_id in GPT2_REPO_IDS:
        try:
            # The folder looked in above (huggingface_hub reads the variables once, when it is imported).
            path = Path(snapshot_download(repo_id, allow_patterns=GPT2_FILES, local_files_only=True, cache_dir=_hub_cache()))
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
            "~/.cache/huggingface/hub/models--openai-community--gpt2 here."
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
        + ". Get the weights once with `sampling-course download-gpt2` (needs internet); "
        "the offline story model needs no download"
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
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Sorted names make the draw order, hence the weights, independent of module order.
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator, device="cpu")  # the generator's device, whatever torch's default
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
    import torch

    torch.manual_seed(TINY_SEED)  # the constructor's own init is overwritten, but keep it tidy
    model = GPT2LMHeadModel(config)
    _perturb_(model, TINY_SEED)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_dir() -> Path:
    """The stand-in's checkpoint directory, built on first use and rebuilt when damaged."""
    from sampling_course.tokenizer import TOKENIZER_DIR

    # The tokenizer's hash is part of the name: a retrained tokenizer means a new model.
    tok_hash = check_assets(Path(TOKENIZER_DIR))["tokenizer.json"]["sha256"][:10]
    target = cache_home() / f"tiny-gpt2-v{TINY_VERSION}-{tok_hash}"
    return cached_folder(target, build_tiny_checkpoint, "tiny model")[0]


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


def quiet_transformers() -> None:
    """Silence transformers' info logs and progress bars (loading and saving are details here)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _bridge(path: Path, tokenizer: object, device: "torch.device", dtype: "torch.dtype") -> object:
    """A TransformerLens bridge around a fresh copy of the checkpoint at ``path``, on ``device`` in ``dtype``."""
    from transformers import GPT2LMHeadModel
    from transformer_lens.model_bridge import TransformerBridge

    quiet_transformers()
    # The bridge rewires the module it is given in place, so it gets a copy of its own and
    # hf_model stays a plain GPT2LMHeadModel.
    bridged = GPT2LMHeadModel.from_pretrained(path, local_files_only=True, dtype=dtype).to(device).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(
            str(path), hf_model=bridged, tokenizer=tokenizer, device=device, dtype=dtype
        )
        # no_processing: keep LayerNorm unfolded and the weights uncentred, exactly as
        # DemoTransformer holds them, so activations can be compared one for one.
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    bridge.eval()
    return bridge


def _hf_config(path: Path) -> SimpleNamespace:
    """The fields of ``config.json`` that ``Config.from_hf`` reads, with GPT2Config's defaults."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BrokenCourseFile(f"the checkpoint's file {path / 'config.json'} cannot be read ({exc})") from None
    defaults = dict(model_type="gpt2", n_embd=768, n_head=12, n_layer=12, n_positions=1024, vocab_size=50257,
                    n_inner=None, layer_norm_epsilon=1e-5, initializer_range=0.02)
    return SimpleNamespace(**{key: raw.get(key, value) for key, value in defaults.items()})


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    # Read into memory, not mapped: a file rewritten later (a cache rebuilt) cannot change these tensors.
    tensors = load((path / "model.safetensors").read_bytes())
    # float32 always: the story checkpoints are stored in float16 to keep the package small.
    return {name: t.float() if t.is_floating_point() else t for name, t in tensors.items()}


def _hf_model(path: Path, device: "torch.device", dtype: "torch.dtype") -> object:
    from transformers import GPT2LMHeadModel

    quiet_transformers()
    # The dtype always explicit: the story checkpoints are stored in float16 to keep the
    # package small, and from_pretrained would otherwise keep the stored dtype.
    return GPT2LMHeadModel.from_pretrained(path, local_files_only=True, dtype=dtype).to(device).eval()


def _hf_tokenizer(path: Path) -> object:
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(path, local_files_only=True)


def _checkpoint_digest(path: Path, listed: dict[str, dict] | None = None) -> str:
    """A SHA-256 over the checkpoint's config and weights (their hashes from a manifest when there is one)."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        if listed is not None and name in listed:
            file_hash = listed[name]["sha256"]
        else:
            file = path / name
            # The hub keeps each file under its SHA-256 and links the snapshot to it: no need to read 500 MB.
            target = Path(os.path.realpath(file)).name
            file_hash = target if len(target) == 64 and all(c in "0123456789abcdef" for c in target) else sha256_of(file)
        digest.update(f"{name}:{file_hash}\n".encode())
    return digest.hexdigest()


@cache
def _settings(path: Path) -> tuple[Config, Tokenizer]:
    return Config.from_hf(_hf_config(path)), Tokenizer(path)


@cache
def _load(name: str, path: Path, digest: str, device: "torch.device | None" = None,
          dtype: "torch.dtype | None" = None) -> Reference:
    import torch

    # The CPU and float32 when not told, as callers of this undecorated loader expect.
    device = torch.device("cpu") if device is None else device
    cfg, tokenizer = _settings(path)
    return Reference(name=name, cfg=cfg, tokenizer=tokenizer, path=path, digest=digest, device=device,
                     dtype=torch.float32 if dtype is None else dtype)


def _dtype(dtype: "torch.dtype | str | None") -> "torch.dtype":
    """``dtype`` as a floating torch.dtype the models can run in (float32 when None)."""
    import torch

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {', '.join(str(d) for d in dtypes)} (float32 by default), got {dtype!r}")
    return dtype


STORY_MODELS = ("story", "story-draft")


def story_model_dir(name: str) -> Path:
    """The shipped directory of a story model (``"story"`` or ``"story-draft"``)."""
    from sampling_course.tokenizer import ASSETS_DIR

    if name not in STORY_MODELS:
        raise ValueError(f"unknown story model {name!r}; choose one of {STORY_MODELS}")
    path = ASSETS_DIR / name
    # A damaged or missing file: one line naming it and saying to reinstall.
    check_assets(path, rebuild="python scripts/train_story_models.py")
    return path


def _checkpoint(name: str) -> tuple[str, Path, dict[str, dict] | None]:
    """The checkpoint ``name`` stands for: its name, its folder, and its manifest (None for GPT-2)."""
    if name == "tiny":
        path = tiny_dir()
        return "tiny", path, read_manifest(path)
    if name in STORY_MODELS:
        path = story_model_dir(name)
        return name, path, check_assets(path)
    if name == "gpt2":
        return "gpt2", _gpt2_dir(allow_download=True), None
    raise ValueError(
        f"unknown reference {name!r}; choose 'auto', 'gpt2', 'story', 'story-draft', 'story-llama', "
        "'story-llama-sink' or 'tiny'"
    )


def reference_settings(name: str = "auto") -> tuple[str, Config, Tokenizer]:
    """The checkpoint ``name`` would load (``"auto"``: GPT-2 when it is cached, else the story model), its
    ``Config`` and its tokenizer, without importing torch or loading weights: a command checks its
    arguments with them before anything heavy loads. Raises what ``load_reference`` raises."""
    if name == "auto":
        name = "gpt2" if gpt2_local_dir() is not None else "story"
    if name in LLAMA_STORY_MODELS:  # a LlamaConfig: n_ctx, d_model and d_vocab mean what they mean in Config
        return (name, *llama_settings(name))
    name, path, _ = _checkpoint(name)
    return (name, *_settings(path))


def load_reference(
    name: Literal["auto", "gpt2", "story", "story-draft", "story-llama", "story-llama-sink", "tiny"] = "auto",
    device: "str | torch.device | None" = None,
    dtype: "torch.dtype | str | None" = None,
    *,
    quiet: bool = False,
) -> Reference:
    """Load a reference checkpoint by name: ``"gpt2"``, ``"story"``, ``"story-draft"``, ``"tiny"`` or ``"auto"``.

    ``"gpt2"`` uses the local Hugging Face cache, downloading once when the hub is
    reachable, and raises ``ReferenceUnavailable`` (saying how to get the weights)
    otherwise. ``"story"`` and ``"story-draft"`` are the models trained on the course's
    story source, shipped with the course. ``"auto"`` falls back to ``"story"`` with a
    visible notice. ``"story-llama"`` is the Llama-style story model of part 9 (``"story-llama-sink"`` the
    same trained with a sink token): it loads as a
    ``LlamaReference`` (``sampling_course.llama_reference``). The result is cached per process
    and shared: treat its models as read-only.

    ``device``: where both models compute; None or ``"auto"`` is the course's device
    (``sampling_course.devices.pick_device``: the test session's, else
    $SAMPLING_COURSE_DEVICE, else cuda, then mps, then cpu). ``dtype``: float32 (the
    default), bfloat16 or float16.
    """
    from sampling_course.devices import pick_device

    where, dtype = pick_device(device), _dtype(dtype)
    if name == "auto":
        try:
            return load_reference("gpt2", where, dtype)
        except ReferenceUnavailable as exc:
            why = str(exc)
        # Outside the except block, and before the notice: an error loading the story model is its
        # own, said alone, not chained to GPT-2's.
        story = load_reference("story", where, dtype)
        if not quiet:
            from rich.console import Console

            Console(stderr=True).print(
                f"[yellow]Notice:[/] real GPT-2 is unavailable ({why.rstrip('.')}); using the offline story "
                "model 'story' instead.", soft_wrap=True, highlight=False,
            )
        return story
    if name in LLAMA_STORY_MODELS:
        return load_llama_reference(name, where, dtype)
    name, path, listed = _checkpoint(name)
    return _load(name, path, _checkpoint_digest(path, listed), where, dtype)
