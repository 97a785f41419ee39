"""Rebuild a shipped tokenizer: train a small GPT-2-style byte-level BPE and save it.

Run from the repository root after editing ``sampling_course/assets/corpus.txt``::

    python scripts/build_tokenizer.py

or, after changing the story grammar in ``sampling_course/stories.py``::

    python scripts/build_tokenizer.py --story

The first overwrites ``sampling_course/assets/tiny_tokenizer/``, the second
``sampling_course/assets/story_tokenizer/``; ``tests/course/test_tokenizer.py`` checks that the
shipped files match what this script produces. A new story tokenizer means the story
models must be retrained too (``python scripts/train_story_models.py``).

The course itself only loads these files (``sampling_course.tokenizer``); training them
is a build step, so it lives here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2TokenizerFast

# Let the script run from a plain checkout, without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sampling_course.stories import sample_stories  # noqa: E402
from sampling_course.tokenizer import (  # noqa: E402
    ASSETS_DIR,
    EOS_TOKEN,
    STORY_TOKENIZER_DIR,
    TOKENIZER_DIR,
)

CORPUS_PATH: Path = ASSETS_DIR / "corpus.txt"
TINY_VOCAB_SIZE = 1024

# The story models' tokenizer (see sampling_course.stories): trained on stories sampled
# from the grammar with a fixed seed, so that rebuilding it gives the same files.
STORY_VOCAB_SIZE = 1000
STORY_TOKENIZER_STORIES = 500
STORY_TOKENIZER_SEED = 2024


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


# ---------------------------------------------------------------------------------------
# The story models' tokenizer
# ---------------------------------------------------------------------------------------


def story_tokenizer_corpus() -> list[str]:
    """The stories the story tokenizer is trained on (the same ones on every machine)."""
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--story", action="store_true", help="rebuild the story tokenizer instead")
    args = parser.parse_args(argv)
    if args.story:
        tokenizer = build_story_tokenizer()
        print(f"Trained on {STORY_TOKENIZER_STORIES} sampled stories: {len(tokenizer)} tokens")
        print(f"Saved to {STORY_TOKENIZER_DIR}")
    else:
        tokenizer = build_tokenizer()
        size_kb = CORPUS_PATH.stat().st_size / 1024
        print(f"Trained on {CORPUS_PATH.name} ({size_kb:.1f} KB): {len(tokenizer)} tokens")
        print(f"Saved to {TOKENIZER_DIR}")


if __name__ == "__main__":
    main()
