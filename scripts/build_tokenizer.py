"""Rebuild a shipped tokenizer.

Run from the repository root after editing ``sampling_course/assets/corpus.txt``::

    python scripts/build_tokenizer.py

or, after changing the story grammar in ``sampling_course/stories.py``::

    python scripts/build_tokenizer.py --story

The first overwrites ``sampling_course/assets/tiny_tokenizer/``, the second
``sampling_course/assets/story_tokenizer/``; ``tests/course/test_tokenizer.py`` checks that the
shipped files match what this script produces. A new story tokenizer means the story
models must be retrained too (``python scripts/train_story_models.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Let the script run from a plain checkout, without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sampling_course.tokenizer import (  # noqa: E402
    CORPUS_PATH,
    STORY_TOKENIZER_DIR,
    STORY_TOKENIZER_STORIES,
    TOKENIZER_DIR,
    build_story_tokenizer,
    build_tokenizer,
)


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
