"""A Hugging Face hub cache holding a stand-in for GPT-2 small, laid out as the hub lays it out.

``fake_gpt2_cache(root)`` writes ``root/models--openai-community--gpt2``: ``refs/main`` naming a
revision, ``blobs/`` holding each file under its SHA-256, and ``snapshots/<revision>/`` linking
each file name to its blob. The tokenizer is the story tokenizer with one token added, so that it
is none of the shipped tokenizers; the weights are empty placeholders (only the tokenizer is read).
Point ``HF_HUB_CACHE`` at ``root`` and ``gpt2_local_dir()`` finds it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer

from sampling_course.tokenizer import STORY_TOKENIZER_DIR

__all__ = ["ADDED_TOKEN", "fake_gpt2_cache"]

ADDED_TOKEN = "<|stand-in for GPT-2|>"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def fake_gpt2_cache(root: Path) -> Path:
    """Write the cache under ``root`` and return the snapshot folder (what ``gpt2_local_dir()`` gives)."""
    backend = BackendTokenizer.from_file(str(STORY_TOKENIZER_DIR / "tokenizer.json"))
    backend.add_tokens([ADDED_TOKEN])
    files = {
        "tokenizer.json": backend.to_str().encode(),
        "tokenizer_config.json": (STORY_TOKENIZER_DIR / "tokenizer_config.json").read_bytes(),
        "config.json": json.dumps({"model_type": "gpt2"}).encode(),
        "model.safetensors": b"",
    }
    repo = root / "models--openai-community--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot
