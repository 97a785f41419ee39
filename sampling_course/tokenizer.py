"""The course's own tokenizers: small byte-level BPEs built the way GPT-2's was.

GPT-2's tokenizer is byte-level BPE with 50,257 tokens. The offline stand-in model
needs the same kind of tokenizer, only much smaller, and one that needs no download.
So we train one here with the ``tokenizers`` library on ``assets/corpus.txt`` (plain
English prose written for this course) and ship the result in
``assets/tiny_tokenizer/``.

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

Rebuild the shipped files after changing the corpus or the story grammar with::

    python scripts/build_tokenizer.py            # the tiny tokenizer
    python scripts/build_tokenizer.py --story    # the story tokenizer
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2TokenizerFast

ASSETS_DIR: Path = Path(__file__).resolve().parent / "assets"
CORPUS_PATH: Path = ASSETS_DIR / "corpus.txt"
TOKENIZER_DIR: Path = ASSETS_DIR / "tiny_tokenizer"

EOS_TOKEN = "<|endoftext|>"
TINY_VOCAB_SIZE = 1024

# The story models' tokenizer (see sampling_course.stories): trained on stories sampled
# from the grammar with a fixed seed, so that rebuilding it gives the same files.
STORY_TOKENIZER_DIR: Path = ASSETS_DIR / "story_tokenizer"
STORY_VOCAB_SIZE = 1000
STORY_TOKENIZER_STORIES = 500
STORY_TOKENIZER_SEED = 2024

__all__ = [
    "CORPUS_PATH",
    "EOS_TOKEN",
    "STORY_TOKENIZER_DIR",
    "STORY_VOCAB_SIZE",
    "TINY_VOCAB_SIZE",
    "TOKENIZER_DIR",
    "build_story_tokenizer",
    "build_tokenizer",
    "load_story_tokenizer",
    "load_tiny_tokenizer",
    "train_story_tokenizer",
    "train_tokenizer",
    "train_tokenizer_on_texts",
]


def train_tokenizer(
    corpus_path: str | Path = CORPUS_PATH, vocab_size: int = TINY_VOCAB_SIZE
) -> GPT2TokenizerFast:
    """Train a GPT-2-style byte-level BPE tokenizer on the text file ``corpus_path``.

    The result has exactly ``vocab_size`` tokens: the 256 single bytes, then
    ``vocab_size - 257`` learned merges, then ``<|endoftext|>`` as the last id (GPT-2
    puts it last too, at 50256). Training is deterministic, so the same corpus always
    gives the same vocabulary, merges and ids.
    """
    text = Path(corpus_path).read_text(encoding="utf-8")
    # One document, not lines: keeps newline runs like "\n\n" visible to the trainer.
    return train_tokenizer_on_texts([text], vocab_size, corpus_name=str(corpus_path))


def train_tokenizer_on_texts(
    texts: list[str], vocab_size: int, corpus_name: str = "the corpus"
) -> GPT2TokenizerFast:
    """Train the same kind of tokenizer on a list of documents (see ``train_tokenizer``).

    Merges never cross from one document into the next, so a corpus of separate
    stories needs no separator between them.
    """
    n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < n_bytes + 1:
        raise ValueError(
            f"vocab_size must be at least {n_bytes + 1} (all bytes + EOS), got {vocab_size}"
        )

    bpe = Tokenizer(models.BPE())
    # GPT-2's recipe: split with its regex, map bytes to printable characters, and do
    # NOT add a space in front of the text (so "Hello" and " Hello" differ).
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        # Leave one slot free: EOS is appended after training so it gets the last id.
        vocab_size=vocab_size - 1,
        # Seed with all 256 bytes, even ones absent from the corpus, so every string
        # is representable and nothing ever needs an UNK.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)

    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges: list[tuple[str, str]] = [tuple(pair) for pair in model["merges"]]
    if len(vocab) != vocab_size - 1:
        # Happens only if the corpus is too small to learn that many merges.
        raise ValueError(
            f"{corpus_name} only supports {len(vocab) + 1} tokens, asked for {vocab_size}"
        )
    vocab[EOS_TOKEN] = len(vocab)

    # Build through GPT2TokenizerFast's own constructor (rather than wrapping `bpe`),
    # so the object we return is exactly what `from_pretrained` rebuilds on load.
    return GPT2TokenizerFast(
        vocab=vocab,
        merges=merges,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        add_prefix_space=False,
    )


def build_tokenizer(
    out_dir: str | Path = TOKENIZER_DIR,
    corpus_path: str | Path = CORPUS_PATH,
    vocab_size: int = TINY_VOCAB_SIZE,
) -> GPT2TokenizerFast:
    """Train the tokenizer and save it to ``out_dir`` with ``save_pretrained``."""
    tokenizer = train_tokenizer(corpus_path, vocab_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def load_tiny_tokenizer() -> GPT2TokenizerFast:
    """Load the shipped tiny tokenizer from ``TOKENIZER_DIR`` (no network needed)."""
    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"The tiny tokenizer is missing from {TOKENIZER_DIR}. "
            "Rebuild it with: python scripts/build_tokenizer.py"
        )
    return GPT2TokenizerFast.from_pretrained(str(TOKENIZER_DIR))


# ---------------------------------------------------------------------------------------
# The story models' tokenizer
# ---------------------------------------------------------------------------------------


def story_tokenizer_corpus() -> list[str]:
    """The stories the story tokenizer is trained on (the same ones on every machine)."""
    from sampling_course.stories import sample_stories

    return [story.text for story in sample_stories(STORY_TOKENIZER_STORIES, STORY_TOKENIZER_SEED)]


def train_story_tokenizer() -> GPT2TokenizerFast:
    """Train the story models' tokenizer: the same recipe, on stories from the grammar.

    The grammar uses a few hundred words, so with 1,000 tokens nearly every word (with
    its leading space) is a single token.
    """
    return train_tokenizer_on_texts(
        story_tokenizer_corpus(), STORY_VOCAB_SIZE, corpus_name="the story corpus"
    )


def build_story_tokenizer(out_dir: str | Path = STORY_TOKENIZER_DIR) -> GPT2TokenizerFast:
    """Train the story tokenizer and save it to ``out_dir`` with ``save_pretrained``."""
    tokenizer = train_story_tokenizer()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def load_story_tokenizer() -> GPT2TokenizerFast:
    """Load the shipped story tokenizer from ``STORY_TOKENIZER_DIR``."""
    if not (STORY_TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"The story tokenizer is missing from {STORY_TOKENIZER_DIR}. "
            "Rebuild it with: python scripts/build_tokenizer.py --story"
        )
    return GPT2TokenizerFast.from_pretrained(str(STORY_TOKENIZER_DIR))


if __name__ == "__main__":
    built = build_tokenizer()
    print(f"Saved a {len(built)}-token tokenizer to {TOKENIZER_DIR}")
