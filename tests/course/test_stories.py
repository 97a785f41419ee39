"""Tests for the story source (sampling_course.stories), its decoding report and the story models trained on it."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sampling_course.implementation import load_demo
from sampling_course.reference import load_reference
from sampling_course.report import DecodingReport, decoding_report, report_table
from sampling_course.stories import (
    EOS_TOKEN,
    Story,
    entropy_floor,
    heldout_stories,
    parse_story,
    prefix_logprob,
    sample_stories,
    sentence_is_valid,
    split_sentences,
    validity,
    whole_sentences,
)
from sampling_course.story_tables import PRONOUNS, WORDS
from sampling_course.tokenizer import load_story_tokenizer

ROOT = Path(__file__).resolve().parents[2]

# The bounds the shipped models are held to: held-out loss minus the entropy floor, in
# nats per token, on ~20,000 tokens of fresh stories.
STORY_GAP = 0.1
DRAFT_GAP = 0.35


@pytest.fixture(scope="module")
def tokenizer():
    return load_story_tokenizer()


@pytest.fixture(scope="module")
def stories() -> list[Story]:
    return sample_stories(200, seed=7)


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text).input_ids)


# ---------------------------------------------------------------------------------------
# The entropy floor, on a source whose entropy rate has a closed form
# ---------------------------------------------------------------------------------------


class CharTokenizer:
    """One token per character: enough for entropy_floor, which only counts tokens."""

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=list(text))


def toy_source(n: int, seed: int, p: dict[str, float], stop: float) -> list[Story]:
    """i.i.d. letters from ``p``; after each letter the story stops with probability ``stop``.

    Stories have at least one letter, so the "end" choice sits after every letter and
    P(text) = prod p(letter) * (1 - stop)^(len - 1) * stop.
    """
    rng = random.Random(seed)
    letters, weights = zip(*p.items())
    out = []
    for _ in range(n):
        text = ""
        logprob = 0.0
        while True:
            letter = rng.choices(letters, weights)[0]
            text += letter
            logprob += math.log(p[letter])
            if rng.random() < stop:
                logprob += math.log(stop)
                break
            logprob += math.log(1 - stop)
        out.append(Story(text, logprob))
    return out


def test_entropy_floor_counts_one_closing_eos_per_story() -> None:
    """sum(-logprob) / sum(tokens + 1), checked by hand."""
    stories = [Story("ab", -3.0), Story("abcd", -5.0)]
    assert entropy_floor(stories, CharTokenizer()) == pytest.approx(8.0 / (3 + 5))
    with pytest.raises(ValueError):
        entropy_floor([], CharTokenizer())


def test_entropy_floor_matches_closed_form_on_a_toy_source() -> None:
    """A geometric-length i.i.d. source has a closed-form entropy rate.

    A story of L letters makes L letter choices and L stop/go choices, so its expected
    entropy is E[L] (H(p) + H_b(stop)), spread over E[L] + 1 tokens (the letters and the
    closing EOS), with E[L] = 1/stop. Sampled estimate vs closed form: the bound is 5.3
    standard errors of the ratio estimator (delta method), a false-failure probability
    of about 1e-7.
    """
    p = {"a": 0.5, "b": 0.3, "c": 0.2}
    stop = 0.2
    stories = toy_source(20_000, seed=3, p=p, stop=stop)
    estimate = entropy_floor(stories, CharTokenizer())

    h_letter = -sum(q * math.log(q) for q in p.values())
    h_stop = -(stop * math.log(stop) + (1 - stop) * math.log(1 - stop))
    mean_letters = 1 / stop
    closed_form = mean_letters * (h_letter + h_stop) / (mean_letters + 1)

    x = [-s.logprob for s in stories]
    y = [len(s.text) + 1 for s in stories]
    mean_y = sum(y) / len(y)
    residual_var = sum((xi - estimate * yi) ** 2 for xi, yi in zip(x, y)) / (len(y) - 1)
    stderr = math.sqrt(residual_var / len(y)) / mean_y
    assert abs(estimate - closed_form) < 5.3 * stderr, (estimate, closed_form, stderr)
    assert stderr < 0.01  # the test has power: the bound is tight


# ---------------------------------------------------------------------------------------
# The grammar: sampling, unique derivation, parsing
# ---------------------------------------------------------------------------------------


def test_sampling_is_deterministic_per_seed() -> None:
    """Same seed, same stories, whatever the global random state; another seed differs."""
    random.seed(1)
    first = sample_stories(20, seed=5)
    random.seed(2)
    assert sample_stories(20, seed=5) == first
    assert sample_stories(20, seed=6) != first
    assert [s.text for s in sample_stories(5, seed=5)] == [s.text for s in first[:5]]


def test_parse_recovers_the_sampled_logprob(stories) -> None:
    """Each text has one derivation, so reading it back gives exactly the sampled log-prob."""
    for story in stories:
        assert story.logprob < 0
        parsed = parse_story(story.text)
        assert parsed is not None, story.text
        assert parsed == pytest.approx(story.logprob, rel=1e-12, abs=1e-12)


def _girl_story(stories) -> Story:
    """A story about a girl with a visit in it (so every perturbation below applies)."""
    return next(s for s in stories if "little girl named" in s.text and "went to the" in s.text)


def test_perturbed_stories_do_not_parse(stories) -> None:
    """Breaking a long-range tie, the format or the ending makes the text impossible."""
    story = _girl_story(stories)
    text = story.text
    name = re.search(r"named (\w+)\.", text).group(1)
    other = next(n for n in WORDS["girl_name"] if n != name)
    sentences = split_sentences(text)
    color = next(c for c in WORDS["color"] if f"a {c} " in sentences[3] or f"her {c} " in sentences[3])
    other_color = next(c for c in WORDS["color"] if c != color)
    bedtime = sentences[-3]
    perturbed = {
        "pronoun": text.replace(" She ", " He ", 1),
        "name changed at the end": text[: text.rindex(name)] + other + text[text.rindex(name) + len(name) :],
        "toy's color changed at bedtime": text.replace(bedtime, bedtime.replace(f" {color} ", f" {other_color} ")),
        "last sentence missing": text[: text.rindex(sentences[-1])].rstrip(),
        "first sentence twice": sentences[0] + " " + text,
        "trailing space": text + " ",
        "closing EOS kept": text + EOS_TOKEN,
        "paragraph break lost": text.replace("\n\n", " ", 1),
    }
    for what, bad in perturbed.items():
        assert bad != text, what
        assert parse_story(bad) is None, what


def test_prefix_logprob_of_a_story_start(stories) -> None:
    """Whole sentences of a story's start score as their own choices; the rest is ignored."""
    story = stories[0]
    sentences = split_sentences(story.text)
    full = prefix_logprob(story.text)
    assert full is not None and full[1] is True and full[0] == pytest.approx(story.logprob)
    head = story.text[: story.text.index(sentences[2]) + len(sentences[2])]
    lp, complete = prefix_logprob(head + " She li")  # a partial sentence is ignored
    assert not complete
    assert story.logprob < lp < 0
    assert prefix_logprob(head) == (lp, False)
    assert prefix_logprob("Purple monkeys dance. " + head) is None
    assert prefix_logprob("") == (0.0, False)


def test_pronouns_agree_with_the_hero(stories) -> None:
    """A girl is "she"/"her", a boy "he"/"his", a child "they"/"their" (and "they were")."""
    forbidden = {"girl": {"he", "him", "his"}, "boy": {"she", "her"}, "child": {"he", "him", "his", "she", "her"}}
    seen = set()
    for story in stories:
        kind = re.search(r"(girl|boy|child) (named|called)", story.text).group(1)
        seen.add(kind)
        words = set(re.findall(r"\w+", story.text.lower()))
        assert not words & forbidden[kind], (kind, words & forbidden[kind])
        assert PRONOUNS[kind]["he"] in words
        assert not re.search(r"\b(She|He) were\b|\bThey was\b", story.text)
        if kind == "child" and "so happy to have" in story.text:
            assert "They were so happy to have" in story.text
    assert seen == set(PRONOUNS)


def test_the_ending_ties_back_to_the_opening(stories) -> None:
    """The toy from the opening is held at bedtime; a dream recalls the first visit."""
    for story in stories:
        toy = re.search(r"(?:favorite toy was a|loved (?:her|his|their)) (\w+ [\w ]+?)(?: very much)?\.", story.text)
        assert toy and toy.group(1) in split_sentences(story.text)[-3], story.text
        visit = re.search(r"went to the (\w+)\.", story.text)
        if visit:
            assert f"the {visit.group(1)}." in split_sentences(story.text)[-2]


@pytest.mark.slow
def test_story_lengths(tokenizer) -> None:
    """Most stories fit a 512-token context; a few run past 1,000 tokens.

    With 4,000 stories about 10 are expected above 1,000 tokens (the chance of none
    is below 1e-4); the seed is fixed, so the test is deterministic.
    """
    texts = [s.text for s in sample_stories(4000, seed=11)]
    lengths = sorted(len(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(texts))
    median = lengths[len(lengths) // 2]
    assert 120 <= median <= 400
    assert sum(n + 2 <= 512 for n in lengths) / len(lengths) > 0.9
    assert sum(n > 1000 for n in lengths) >= 1
    assert min(lengths) >= 50  # even the shortest story has eight sentences


# ---------------------------------------------------------------------------------------
# Judging generated text: hand-made cases with known answers
# ---------------------------------------------------------------------------------------

OPENING = (
    "Once upon a time, there was a little girl named Mia. She lived in a big farm on the hill. "
    "Mia had a dog named Spot."
)


def test_validity_counts_whole_sentences() -> None:
    assert validity(OPENING) == 1.0
    assert validity(OPENING + " Purple monkeys dance.") == 0.75
    assert validity(OPENING + " Purple monkeys da") == 1.0  # a partial sentence is ignored
    assert validity(OPENING + EOS_TOKEN + "Purple monkeys dance.") == 0.75
    assert math.isnan(validity("no sentence here"))


def test_whole_sentences_drops_only_a_trailing_partial_sentence() -> None:
    assert whole_sentences(OPENING + " Purple monkeys da") == OPENING
    assert whole_sentences(OPENING + " Mia was happy.") == OPENING + " Mia was happy."
    assert whole_sentences("no sentence here") == ""
    assert whole_sentences('The fox asked, "Will you be my friend?" And') == 'The fox asked, "Will you be my friend?"'


@pytest.mark.parametrize(
    "sentence, valid",
    [
        ("Mia loved her red ball very much.", True),
        ("Tom loved his red ball very much.", True),
        ("Alex loved their red ball very much.", True),
        ("Tom loved her red ball very much.", False),  # pronoun and name disagree
        ("They was happy.", False),
        ("Tom loved his red dragon very much.", False),  # not a toy the grammar knows
        ('The fox asked, "Will you be my friend?"', True),
        ('The fox asked, "Will you be my friend."', False),
    ],
)
def test_sentence_validity(sentence: str, valid: bool) -> None:
    assert sentence_is_valid(sentence) is valid


def test_repetition_metrics_on_hand_made_texts(tokenizer) -> None:
    """Words "a b a b a b": 2 of 5 bigrams and 2 of 4 trigrams distinct, 1 of 3 4-grams repeated."""
    report = decoding_report(["a b a b a b"], tokenizer=tokenizer)
    assert report.distinct_2 == pytest.approx(2 / 5)
    assert report.distinct_3 == pytest.approx(2 / 4)
    assert report.repeated_4grams == pytest.approx(1 / 3)
    assert math.isnan(report.valid) and math.isnan(report.logprob_per_token) and report.parsed == 0
    # Pooled over texts: distinct counts across texts, repeats only within a text.
    two = decoding_report(["x y z w", "x y z w"], tokenizer=tokenizer)
    assert two.distinct_2 == pytest.approx(3 / 6)
    assert two.repeated_4grams == 0
    assert two.mean_tokens == n_tokens(tokenizer, "x y z w")


def test_report_scores_continuations_against_the_source(stories, tokenizer) -> None:
    """A true continuation scores its exact log-prob per token; a wrong one is invalid."""
    story = stories[1]
    sentences = split_sentences(story.text)
    cut = story.text.index(sentences[3]) + len(sentences[3])
    prompt, rest = story.text[:cut], story.text[cut:]
    expected = (story.logprob - prefix_logprob(prompt)[0]) / (
        n_tokens(tokenizer, story.text) - n_tokens(tokenizer, prompt) + 1
    )
    padded = rest + EOS_TOKEN * 3 + "Purple"  # what follows the first EOS is ignored
    report = decoding_report([padded, "Purple monkeys dance. And"], prompt=prompt, tokenizer=tokenizer)
    assert isinstance(report, DecodingReport)
    assert report.n == 2 and report.parsed == 0.5
    assert report.logprob_per_token == pytest.approx(expected)
    n_rest = len(split_sentences(rest))
    assert report.valid == pytest.approx(n_rest / (n_rest + 1))
    assert report.mean_tokens == pytest.approx(
        (n_tokens(tokenizer, rest) + n_tokens(tokenizer, "Purple monkeys dance. And")) / 2
    )

    from rich.console import Console

    console = Console(record=True, width=140)
    console.print(report_table({"true story": report}))
    assert "true story" in console.export_text()


def test_heldout_stories_fit_the_context_and_add_up(tokenizer) -> None:
    """Held-out stories fit whole (<|endoftext|> + story + <|endoftext|> <= n_ctx), come from HELDOUT_SEED
    (the same call gives the same stories, another seed others), and total at least the tokens asked for."""
    stories = heldout_stories(tokenizer, n_ctx=128, n_tokens=3_000)
    lengths = [len(tokenizer(s.text).input_ids) for s in stories]
    assert max(lengths) + 2 <= 128
    assert 3_000 <= sum(n + 1 for n in lengths) < 3_000 + 128, "stops at the first story that reaches the total"
    assert heldout_stories(tokenizer, n_ctx=128, n_tokens=3_000) == stories
    assert heldout_stories(tokenizer, n_ctx=128, n_tokens=3_000, seed=1)[0] != stories[0]
    everything = heldout_stories(tokenizer, n_ctx=10_000, n_tokens=3_000)
    assert any(len(tokenizer(s.text).input_ids) + 2 > 128 for s in everything), "a smaller context leaves stories out"
    with pytest.raises(ValueError, match="n_ctx"):
        heldout_stories(tokenizer, n_ctx=2)
    with pytest.raises(ValueError, match="larger n_ctx"):
        heldout_stories(tokenizer, n_ctx=5, n_tokens=10)


# ---------------------------------------------------------------------------------------
# The training script
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script():
    """scripts/train_story_models.py, imported as a module (it also measures held-out loss)."""
    if "train_story_models" not in sys.modules:
        spec = importlib.util.spec_from_file_location("train_story_models", ROOT / "scripts" / "train_story_models.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules["train_story_models"]


def test_training_smoke_run_lowers_the_loss(script, tmp_path) -> None:
    # Every window starts with <|endoftext|> and the beginning of a story.
    tok = load_story_tokenizer()
    window = next(script.windows(tok, 128, seed=0))
    assert len(window) == 128 and window[0] == tok.eos_token_id
    assert tok.decode(window[1:8]).startswith(("Once upon a time", "There once was"))

    (figures,) = script.main(["--smoke", "--out", str(tmp_path), "--tokens", str(20 * 4 * 128)])
    (stage,) = figures["stages"]
    assert stage["last_train_loss"] < stage["first_train_loss"] - 1.0
    saved = tmp_path / "smoke"
    assert json.loads((saved / "training.json").read_text())["stages"][0]["steps"] == 20
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()


# ---------------------------------------------------------------------------------------
# The shipped story models
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft():
    return load_reference("story-draft")


@pytest.mark.parametrize("name", ["story", "story-draft"])
def test_story_models_load_like_a_hub_checkpoint(name: str, tokenizer) -> None:
    ref = load_reference(name)
    assert ref.name == name
    assert next(ref.hf_model.parameters()).dtype == torch.float32  # stored as float16
    assert ref.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert ref.cfg.d_vocab == len(tokenizer) and ref.cfg.n_ctx == 512
    assert not ref.hf_model.training


def test_auto_falls_back_to_the_story_model(monkeypatch, capsys) -> None:
    """Without GPT-2, "auto" gives the story model and says so."""
    import sampling_course.reference as reference_module

    def unavailable(allow_download: bool):
        raise reference_module.ReferenceUnavailable("no GPT-2 here")

    monkeypatch.setattr(reference_module, "_gpt2_dir", unavailable)
    assert load_reference("auto").name == "story"
    notice = " ".join(capsys.readouterr().err.split())
    assert "no GPT-2 here" in notice and "using the offline story model 'story'" in notice
    assert "tiny" not in notice, "one fallback, named once"
    with pytest.raises(ValueError, match="'story-draft'"):
        load_reference("story-large")


def test_missing_story_checkpoint_says_how_to_rebuild(monkeypatch, tmp_path) -> None:
    """A missing story checkpoint is the course's own file broken: one line naming it, to reinstall or retrain."""
    import sampling_course.reference as reference_module
    import sampling_course.tokenizer as tokenizer_module
    from sampling_course.files import BrokenCourseFile

    monkeypatch.setattr(tokenizer_module, "ASSETS_DIR", tmp_path)
    with pytest.raises(BrokenCourseFile, match="train_story_models.py") as raised:
        reference_module.story_model_dir("story")
    assert str(tmp_path / "story") in str(raised.value) and "reinstall" in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["story", "story-draft"])
def test_demo_transformer_matches_hf_logits(name: str) -> None:
    ref = load_reference(name)
    ids = ref.tokenizer(EOS_TOKEN + OPENING, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = ref.hf_model(ids).logits
        actual = load_demo(ref)(ids)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_heldout_loss_is_near_the_entropy_floor(script, story, draft, tokenizer) -> None:
    """"story" is within 0.1 nats/token of the floor; the draft within its looser bound, and not the tighter one.

    The loss and the floor are computed on the same ~20,000 tokens of stories sampled
    with a seed that training never used. The draft failing the tighter bound shows the
    check can tell a weaker model from the target.
    """
    stories = heldout_stories(tokenizer, n_ctx=512)
    floor = entropy_floor(stories, tokenizer)
    gaps = {}
    for ref in (story, draft):
        loss = script.story_loss(ref.hf_model, ref.tokenizer, stories)
        assert loss > floor - 0.02, "a loss below the floor means the loss or the floor is miscounted"
        gaps[ref.name] = loss - floor
    assert gaps["story"] < STORY_GAP, gaps
    assert gaps["story-draft"] < DRAFT_GAP, gaps
    assert gaps["story-draft"] > STORY_GAP, gaps
