"""The course's own tokenizers: small byte-level BPEs built the way GPT-2's was.

GPT-2's tokenizer is byte-level BPE with 50,257 tokens. The offline stand-in model
needs the same kind of tokenizer, only much smaller, and one that needs no download.
So the course trains one with the ``tokenizers`` library on ``assets/corpus.txt``
(plain English prose written for this course) and ships the result in
``assets/tiny_tokenizer/``; this module loads it.

It behaves like GPT-2's tokenizer in every way a learner will notice:

* it is a ``transformers.GPT2TokenizerFast``;
* it is byte-level, so *any* string encodes and decodes back exactly;
* a leading space is part of the token (``" church"`` is one token, ``"church"`` another);
* the base vocabulary is the 256 bytes in GPT-2's own order, followed by the learned
  merges, and ``<|endoftext|>`` is the last id, serving as BOS, EOS and UNK;
* there is no pad token.

The story models (``load_reference("story")``) use a second tokenizer of the same kind,
trained on stories from ``sampling_course.stories`` and shipped in
``assets/story_tokenizer/``.

Training is not part of the course engine: ``scripts/build_tokenizer.py`` rebuilds the
shipped files after a change to the corpus or the story grammar::

    python scripts/build_tokenizer.py            # the tiny tokenizer
    python scripts/build_tokenizer.py --story    # the story tokenizer
"""

from __future__ import annotations

from pathlib import Path

from transformers import GPT2TokenizerFast

ASSETS_DIR: Path = Path(__file__).resolve().parent / "assets"
TOKENIZER_DIR: Path = ASSETS_DIR / "tiny_tokenizer"
STORY_TOKENIZER_DIR: Path = ASSETS_DIR / "story_tokenizer"

EOS_TOKEN = "<|endoftext|>"

__all__ = [
    "ASSETS_DIR",
    "EOS_TOKEN",
    "STORY_TOKENIZER_DIR",
    "TOKENIZER_DIR",
    "load_story_tokenizer",
    "load_tiny_tokenizer",
]


def load_tiny_tokenizer() -> GPT2TokenizerFast:
    """Load the shipped tiny tokenizer from ``TOKENIZER_DIR`` (no network needed)."""
    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"The tiny tokenizer is missing from {TOKENIZER_DIR}. "
            "Rebuild it with: python scripts/build_tokenizer.py"
        )
    return GPT2TokenizerFast.from_pretrained(str(TOKENIZER_DIR))


def load_story_tokenizer() -> GPT2TokenizerFast:
    """Load the shipped story tokenizer from ``STORY_TOKENIZER_DIR``."""
    if not (STORY_TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"The story tokenizer is missing from {STORY_TOKENIZER_DIR}. "
            "Rebuild it with: python scripts/build_tokenizer.py --story"
        )
    return GPT2TokenizerFast.from_pretrained(str(STORY_TOKENIZER_DIR))
