"""The course's own tokenizers: small byte-level BPEs built the way GPT-2's was.

GPT-2's tokenizer is byte-level BPE with 50,257 tokens. The offline stand-in model
needs the same kind of tokenizer, only much smaller, and one that needs no download.
So the course trains one with the ``tokenizers`` library on ``assets/corpus.txt``
(plain English prose written for this course) and ships the result in
``assets/tiny_tokenizer/``; this module loads it.

It behaves like GPT-2's tokenizer in every way a learner will notice:

* ``load_tiny_tokenizer()`` gives a ``transformers.GPT2TokenizerFast``, and the models'
  ``reference.tokenizer`` a ``Tokenizer`` (below) that encodes and decodes exactly as it does;
* it is byte-level, so *any* string encodes and decodes back exactly;
* a leading space is part of the token (``" church"`` is one token, ``"church"`` another);
* the base vocabulary is the 256 bytes in GPT-2's own order, followed by the learned
  merges, and ``<|endoftext|>`` is the last id, serving as BOS, EOS and UNK;
* there is no pad token.

The story models (``load_reference("story")``) use a second tokenizer of the same kind,
trained on stories from ``sampling_course.stories`` and shipped in
``assets/story_tokenizer/``.

``Tokenizer`` is the course's own small front to the same ``tokenizer.json``, with the part
of ``GPT2TokenizerFast``'s interface the course uses (``encode``, ``decode``, calling it,
``eos_token_id``, ...). It loads in milliseconds, where importing ``transformers`` takes
seconds, so that checking an exercise stays quick; ``tests/course/test_tokenizer.py``
checks that both give the same ids and the same text.

Training is not part of the course engine: ``scripts/build_tokenizer.py`` rebuilds the
shipped files after a change to the corpus or the story grammar::

    python scripts/build_tokenizer.py            # the tiny tokenizer
    python scripts/build_tokenizer.py --story    # the story tokenizer
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sampling_course.files import check_assets

if TYPE_CHECKING:  # transformers loads only for the Hugging Face tokenizer itself
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
    "Tokenizer",
    "load_story_tokenizer",
    "load_tiny_tokenizer",
]


def load_tiny_tokenizer() -> "GPT2TokenizerFast":
    """Load the shipped tiny tokenizer from ``TOKENIZER_DIR`` as a ``GPT2TokenizerFast`` (no network needed)."""
    from transformers import GPT2TokenizerFast

    # One line naming a damaged or missing file, rather than a parser's traceback.
    check_assets(TOKENIZER_DIR, rebuild="python scripts/build_tokenizer.py")
    return GPT2TokenizerFast.from_pretrained(str(TOKENIZER_DIR))


def load_story_tokenizer() -> "GPT2TokenizerFast":
    """Load the shipped story tokenizer from ``STORY_TOKENIZER_DIR`` as a ``GPT2TokenizerFast``."""
    from transformers import GPT2TokenizerFast

    check_assets(STORY_TOKENIZER_DIR, rebuild="python scripts/build_tokenizer.py --story")
    return GPT2TokenizerFast.from_pretrained(str(STORY_TOKENIZER_DIR))


class Encoding(dict):
    """What calling a ``Tokenizer`` returns: ``input_ids`` and ``attention_mask``, as keys and attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Tokenizer:
    """A GPT-2-style byte-level BPE tokenizer read from a ``tokenizer.json``, without ``transformers``.

    Gives the same ids and text as ``GPT2TokenizerFast`` on the same files: nothing is added
    around the text (no BOS), ``<|endoftext|>`` is EOS, BOS and UNK, there is no pad token,
    and decoding does no clean-up of spaces.
    """

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer as BackendTokenizer

        self.folder = Path(folder)
        self.backend_tokenizer = BackendTokenizer.from_file(str(self.folder / "tokenizer.json"))
        config = json.loads((self.folder / "tokenizer_config.json").read_text())

        def special(key: str) -> str | None:
            value = config.get(key)
            return value.get("content") if isinstance(value, dict) else value

        self.eos_token = special("eos_token")
        self.bos_token = special("bos_token")
        self.unk_token = special("unk_token")
        self.pad_token = special("pad_token")
        self.name_or_path = str(self.folder)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    @property
    def all_special_tokens(self) -> list[str]:
        """Every special token once: BOS, EOS, UNK, pad (those set), then any other special added token."""
        named = [self.bos_token, self.eos_token, self.unk_token, self.pad_token]
        added = [t.content for _, t in sorted(self.backend_tokenizer.get_added_tokens_decoder().items()) if t.special]
        return list(dict.fromkeys(t for t in named + added if t is not None))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend_tokenizer.token_to_id(t) for t in self.all_special_tokens]

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.folder)!r}, vocabulary {len(self)})"

    # Encoding -----------------------------------------------------------------------

    def _ids(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text to encode must be a str, got {type(text).__name__}")
        return self.backend_tokenizer.encode(text).ids

    @staticmethod
    def _as(ids: list[list[int]], return_tensors: str | None):
        if return_tensors is None:
            return ids
        if return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        import torch

        if len({len(row) for row in ids}) > 1:
            raise ValueError("texts of different lengths cannot make one tensor (this tokenizer does not pad)")
        return torch.tensor(ids, dtype=torch.long)

    def encode(self, text: str, return_tensors: str | None = None, **_: Any):
        """Token ids of ``text``: a list, or with ``return_tensors="pt"`` a ``(1, n)`` tensor."""
        ids = self._ids(text)
        return ids if return_tensors is None else self._as([ids], return_tensors)

    def __call__(self, text: str | Sequence[str], return_tensors: str | None = None, **_: Any) -> Encoding:
        """``Encoding(input_ids=..., attention_mask=...)`` for one text or a list of them."""
        if isinstance(text, str):
            ids = self._ids(text)
            if return_tensors is None:
                return Encoding(input_ids=ids, attention_mask=[1] * len(ids))
            tensor = self._as([ids], return_tensors)
        else:
            rows = [self._ids(t) for t in text]
            if return_tensors is None:
                return Encoding(input_ids=rows, attention_mask=[[1] * len(r) for r in rows])
            tensor = self._as(rows, return_tensors)
        import torch

        return Encoding(input_ids=tensor, attention_mask=torch.ones_like(tensor))

    def tokenize(self, text: str) -> list[str]:
        return self.backend_tokenizer.encode(text).tokens

    def convert_ids_to_tokens(self, ids: int | Sequence[int]):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    # Decoding -----------------------------------------------------------------------

    @staticmethod
    def _plain_ids(ids: Any) -> list[int]:
        if hasattr(ids, "tolist"):  # a tensor or an array, of any number of dimensions up to one row
            ids = ids.tolist()
        if isinstance(ids, int):
            return [ids]
        flat = list(ids)
        if flat and isinstance(flat[0], list):  # a (1, n) tensor
            if len(flat) != 1:
                raise ValueError("decode takes one sequence; use batch_decode for several")
            flat = flat[0]
        return [int(i) for i in flat]

    def decode(self, ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None,
               **_: Any) -> str:
        """The text of ``ids`` (an int, a list, or a 0-d, 1-d or (1, n) tensor). ``clean_up_tokenization_spaces``
        is accepted and, as in ``GPT2TokenizerFast``, changes nothing: byte-level text decodes exactly."""
        return self.backend_tokenizer.decode(self._plain_ids(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Any, **kwargs: Any) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(row, **kwargs) for row in sequences]

    def save_pretrained(self, folder: str | Path) -> None:
        """Copy ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder``."""
        import shutil

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(self.folder / name, folder / name)
