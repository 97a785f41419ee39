"""Rebuild the offline stand-in's tokenizer from the shipped corpus.

Run from the repository root after editing ``sampling_course/assets/corpus.txt``::

    python scripts/build_tokenizer.py

It overwrites ``sampling_course/assets/tiny_tokenizer/``; ``tests/test_tokenizer.py``
checks that the shipped files match what this script produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Let the script run from a plain checkout, without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sampling_course.tokenizer import CORPUS_PATH, TOKENIZER_DIR, build_tokenizer  # noqa: E402


def main() -> None:
    tokenizer = build_tokenizer()
    size_kb = CORPUS_PATH.stat().st_size / 1024
    print(f"Trained on {CORPUS_PATH.name} ({size_kb:.1f} KB): {len(tokenizer)} tokens")
    print(f"Saved to {TOKENIZER_DIR}")


if __name__ == "__main__":
    main()
