"""The vocabulary of ``sampling-course bench-structured``: GPT-2's own when it is cached, else a BPE of GPT-2's size.

When GPT-2 is not in the local Hugging Face cache, a 50,257-token byte-level BPE is trained here
with the ``tokenizers`` library on the course's own text (its source, corpus and generated
stories), which only supports about 10,000 merges; the rest of the vocabulary is made by merging
pairs of learned tokens, as GPT-2's longer tokens join a word start and a word piece.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

GPT2_VOCAB_SIZE = 50_257


@dataclass
class Vocabulary:
    label: str
    tokens: list  # token id -> bytes (None for special tokens)
    eos_token_id: int


def course_texts() -> list[str]:
    """Text the course ships: its source, its corpus, and stories from its grammar."""
    import sampling_course
    from sampling_course.stories import sample_stories

    root = Path(sampling_course.__file__).parent
    texts = [path.read_text(errors="ignore") for path in sorted(root.rglob("*")) if path.suffix in (".py", ".txt", ".md")]
    return texts + [story.text for story in sample_stories(3000, seed=0)]


def built_bpe_tokenizer(size: int = GPT2_VOCAB_SIZE, seed: int = 0):
    """A byte-level BPE tokenizer of ``size`` tokens, trained with ``tokenizers`` on the course's text,
    the merges the text cannot support made by joining pairs of learned tokens; and how many were learned."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    special = "<|endoftext|>"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=size, min_frequency=1, special_tokens=[special],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(course_texts(), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    vocab, merges = dict(model["vocab"]), [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    learned = len(vocab)
    # Word starts ("Ġ...") followed by word pieces, as GPT-2's longer tokens are.
    rng = random.Random(seed)
    starts = [t for t in vocab if t.startswith("Ġ") and len(t) > 1]
    pieces = [t for t in vocab if not t.startswith("Ġ") and t != special and t.isalpha()]
    while len(vocab) < size:
        left, right = rng.choice(starts), rng.choice(pieces)
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append((left, right))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([special])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=special)
    return wrapped, learned


def load_vocabulary(token_index, quick: bool) -> Vocabulary:
    from sampling_course.reference import gpt2_local_dir, load_reference

    if quick:
        tokenizer = load_reference("story").tokenizer
        label = f"the story model's tokenizer ({len(tokenizer):,} tokens; --quick)"
    elif gpt2_local_dir() is not None:
        from transformers import GPT2TokenizerFast

        tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_local_dir(), local_files_only=True)
        label = f"GPT-2's tokenizer ({len(tokenizer):,} tokens)"
    else:
        tokenizer, learned = built_bpe_tokenizer()
        label = (
            f"GPT-2 is not cached here: a {len(tokenizer):,}-token byte-level BPE built with `tokenizers` from the course's "
            f"own text ({learned:,} tokens learned from it, the rest made by merging pairs of learned tokens)"
        )
    return Vocabulary(label, token_index.token_bytes(tokenizer), tokenizer.eos_token_id)
