"""Tests for the course's byte-level BPE tokenizers: the shipped files and the script that builds them."""

from __future__ import annotations

import runpy
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import GPT2TokenizerFast

from sampling_course.tokenizer import EOS_TOKEN, load_story_tokenizer, load_tiny_tokenizer

# The build script (training is a build step, outside the package), run as a module of its own.
BUILD = SimpleNamespace(**runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "build_tokenizer.py")))

# Prompts the course's other tests feed to the stand-in model.
COURSE_PROMPTS = [
    "John and Mary went to the church",
    "John and Mary went to the house",
    "Jingle bells, jingle bells, jingle all the way",
    "When I was a kid",
    "When I was growing up",
    "When I was in the",
    "up to the top of the mountain",
    "The cat sat on the mat",
]

ROUND_TRIP_TEXTS = [
    "Hello, world! It's 3.14 and \"quoted\" (yes) ; ok?",
    "Hello , world ! it 's n't .",  # spaces before punctuation must survive decoding
    "Café, naïve, façade, Ærøskøbing, São Paulo",
    "Emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧",
    "中文分词测试，日本語のテキスト。",
    "  leading, double  spaces,\ttabs\t\tand trailing   ",
    "line one\nline two\n\n\nafter blank lines\r\n",
    "",
]


@lru_cache(maxsize=1)
def shipped() -> GPT2TokenizerFast:
    """Load the shipped tokenizer once for the whole module."""
    return load_tiny_tokenizer()


def test_shipped_tokenizer_matches_retraining() -> None:
    """Retraining on the shipped corpus reproduces the shipped files exactly (they are in sync)."""
    retrained = BUILD.train_tokenizer(BUILD.CORPUS_PATH)
    tok = shipped()
    assert retrained.get_vocab() == tok.get_vocab()
    # Same merges, in the same order, is what makes the ids agree on any text.
    assert retrained.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    sample = BUILD.CORPUS_PATH.read_text(encoding="utf-8")[:2000] + " Ünïcödé 😀 " + EOS_TOKEN
    assert retrained.encode(sample) == tok.encode(sample)


def test_is_gpt2_style_tokenizer_with_eos() -> None:
    """It is a GPT2TokenizerFast of 1024 tokens, EOS/BOS/UNK = <|endoftext|>, no pad token."""
    tok = shipped()
    assert isinstance(tok, GPT2TokenizerFast)
    assert len(tok) == BUILD.TINY_VOCAB_SIZE == 1024
    assert tok.eos_token == tok.bos_token == tok.unk_token == EOS_TOKEN
    assert 0 <= tok.eos_token_id < len(tok)
    # Like GPT-2 (id 50256), EOS is the last id.
    assert tok.eos_token_id == len(tok) - 1
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == EOS_TOKEN
    assert tok.pad_token is None


def test_every_byte_is_a_base_token() -> None:
    """Ids 0-255 are the 256 single bytes, in GPT-2's byte order, so no text ever needs UNK."""
    from tokenizers.pre_tokenizers import ByteLevel

    tok = shipped()
    assert set(tok.convert_ids_to_tokens(list(range(256)))) == set(ByteLevel.alphabet())
    assert tok.convert_ids_to_tokens([0, 1, 71]) == ["!", '"', "h"]  # same ids as GPT-2


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_byte_level_round_trip(text: str) -> None:
    """decode(encode(s)) == s for ASCII, accents, emoji, CJK, whitespace runs and newlines."""
    tok = shipped()
    ids = tok.encode(text)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_eos_string_encodes_to_single_id() -> None:
    """The literal text "<|endoftext|>" becomes the one EOS id, even inside other text."""
    tok = shipped()
    assert tok(EOS_TOKEN).input_ids == [tok.eos_token_id]
    ids = tok("first story." + EOS_TOKEN + "Second story.").input_ids
    assert ids.count(tok.eos_token_id) == 1
    assert tok.decode(ids) == "first story." + EOS_TOKEN + "Second story."


def test_no_special_tokens_added_by_default() -> None:
    """Like GPT-2, encoding adds no BOS/EOS of its own."""
    tok = shipped()
    assert tok("hello world").input_ids == tok.convert_tokens_to_ids(tok.tokenize("hello world"))
    assert tok.eos_token_id not in tok("hello world").input_ids


def test_missing_files_give_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading from an empty directory raises FileNotFoundError that says how to rebuild."""
    import sampling_course.tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "TOKENIZER_DIR", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="scripts/build_tokenizer.py"):
        tokenizer_module.load_tiny_tokenizer()


@pytest.mark.parametrize("word", [" church", " house", " mountain", " mat"])
def test_prompt_words_are_single_tokens(word: str) -> None:
    """Key continuation words of the course prompts are single tokens, with the leading space."""
    assert len(shipped()(word).input_ids) == 1


@pytest.mark.parametrize("prompt", COURSE_PROMPTS)
def test_course_prompts_tokenize_compactly(prompt: str) -> None:
    """The prompts used across the course are roughly one token per word."""
    ids = shipped()(prompt).input_ids
    assert len(ids) <= len(prompt.split()) + 3
    assert shipped().decode(ids) == prompt


# ---------------------------------------------------------------------------------------
# The story models' tokenizer
# ---------------------------------------------------------------------------------------


def test_shipped_story_tokenizer_matches_retraining() -> None:
    """Retraining on the seeded story corpus reproduces the shipped story tokenizer exactly."""
    shipped_story = load_story_tokenizer()
    retrained = BUILD.train_story_tokenizer()
    assert retrained.get_vocab() == shipped_story.get_vocab()
    assert retrained.backend_tokenizer.to_str() == shipped_story.backend_tokenizer.to_str()


def test_story_tokenizer_is_gpt2_style_and_word_level_on_stories() -> None:
    """1,000 tokens, EOS last; story words are mostly single tokens; stories round-trip."""
    from sampling_course.stories import sample_stories

    tok = load_story_tokenizer()
    assert isinstance(tok, GPT2TokenizerFast)
    assert len(tok) == BUILD.STORY_VOCAB_SIZE == 1000
    assert tok.eos_token == tok.bos_token == EOS_TOKEN and tok.eos_token_id == len(tok) - 1
    texts = [s.text for s in sample_stories(50, seed=123)]
    for text in texts:
        assert tok.decode(tok(text).input_ids) == text
    n_words = sum(len(t.split()) for t in texts)
    n_tokens = sum(len(tok(t).input_ids) for t in texts)
    assert n_tokens < 1.4 * n_words  # a word and its punctuation: about 1.25 tokens
    for word in ["Once", " upon", " favorite", " squirrel", " pillow"]:
        assert len(tok(word).input_ids) == 1
