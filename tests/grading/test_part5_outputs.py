"""Part 5: stop strings (against Hugging Face's ``StopStringCriteria``) and streaming."""

from __future__ import annotations

import pytest
import torch

from doubles import RecordingFile
from sampling_course.beside import made_beside
from part5_shared import assert_same_tokens, left_padded, Part5, PROMPTS, with_05b_solved


@pytest.fixture(autouse=True)
def later_helpers(request, impl, monkeypatch):
    """Notebook 05's exercises run with notebook 05b's functions as the solutions write them (see with_05b_solved)."""
    with_05b_solved(request, impl, monkeypatch)


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------------------

STOP_TEXT = " The cat sat on the mat, and the dog stopped there; then they went home."


def hf_stop_verdicts(reference, ids: list[int], stop_strings: list[str]) -> list[bool]:
    """Oracle: Hugging Face's StopStringCriteria on every prefix ids[:1], ids[:2], ...: stop or not."""
    from transformers import StopStringCriteria

    criterion = StopStringCriteria(reference.hf_tokenizer, stop_strings)
    return [bool(criterion(torch.tensor([ids[:end]]), None)[0]) for end in range(1, len(ids) + 1)]


@pytest.mark.exercise("StopStringCriteria")
def test_stop_strings_match_hf_criterion(gen, tiny, oracle):
    """On every prefix of a tokenized text, StopStringCriteria agrees with Hugging Face's: a row stops exactly
    when a stop string ends inside the newest token's text, also when it spans several tokens."""
    tok = tiny.tokenizer
    ids = tok.encode(STOP_TEXT)
    stop_strings = ["at,", "e dog", "stop", "ere;", " the", "ome.", "xyz", "t o", "n the mat"]
    ours = gen.StopStringCriteria(tok, stop_strings)
    theirs = oracle(hf_stop_verdicts, tiny, ids, stop_strings)
    multi_token_hits = 0
    for end in range(1, len(ids) + 1):
        prefix = torch.tensor([ids[:end]])
        expected = theirs[end - 1]
        actual = ours(prefix, torch.zeros(1, tiny.cfg.d_vocab))
        assert actual.shape == (1,), f"a criterion returns one bool per row, got shape {tuple(actual.shape)}"
        assert bool(actual[0]) == expected, (
            f"after {tok.decode(ids[:end])!r}: yours says {bool(actual[0])}, Hugging Face's {expected}"
        )
        if expected and not any(s in tok.decode(ids[end - 1 : end]) for s in stop_strings):
            multi_token_hits += 1
    assert multi_token_hits >= 3, "the text should contain stop strings spread over several tokens"


@pytest.mark.exercise("StopStringCriteria")
def test_stop_string_with_a_character_split_across_tokens(gen, tiny):
    """A stop string ending in a character whose bytes span two tokens matches once its last byte arrives, not
    before (decode the tail together: one token's bytes alone are not a character)."""
    tok = tiny.tokenizer
    ids = tok.encode(" café au lait")
    crit = gen.StopStringCriteria(tok, ["café"])
    verdicts = [bool(crit(torch.tensor([ids[:end]]), None)[0]) for end in range(1, len(ids) + 1)]
    first = next(end for end in range(1, len(ids) + 1) if "café" in tok.decode(ids[:end]))
    assert tok.decode(ids[first - 1 : first]) != "é", "the test needs 'é' split over tokens"
    assert verdicts == [end == first for end in range(1, len(ids) + 1)], f"verdicts per prefix: {verdicts}"


def hf_generate_with_stop_strings(reference, prompts: list[str], new: int, stops: list[str]) -> torch.Tensor:
    """Oracle: Hugging Face's greedy generate on the left-padded prompts, with stop strings."""
    tok = reference.tokenizer
    ids, mask = left_padded([tok.encode(p) for p in prompts], tok.eos_token_id)
    return reference.hf_model.generate(
        ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, stop_strings=stops, tokenizer=reference.hf_tokenizer,
    )


@pytest.mark.exercise("StopStringCriteria")
def test_generate_with_stop_strings_matches_hf(gen, demo, reference, oracle):
    """generate(stop_strings=...) stops each row where Hugging Face's generate does and keeps the tokens that
    completed the stop string. The stop strings are cut from the rows' own greedy text, across token boundaries."""
    tok, new = reference.tokenizer, 14
    free = gen.generate(demo, tok, PROMPTS, new, temperature=0.0)
    width = free.shape[1] - new
    stops = []
    for row in (0, 2):  # a piece spanning the first boundary between two whole-character tokens, from new token 3
        pieces = [tok.decode(free[row, i : i + 1]) for i in range(width + 3, free.shape[1])]
        i = next(i for i in range(len(pieces) - 1) if "\ufffd" not in pieces[i] + pieces[i + 1])
        stops.append(pieces[i][-2:] + pieces[i + 1][:2])
    out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, stop_strings=stops)
    expected = oracle(hf_generate_with_stop_strings, reference, PROMPTS, new, stops)
    assert_same_tokens(out, expected, f"greedy with stop_strings={stops} vs Hugging Face")
    assert out.shape != free.shape or not torch.equal(out, free), "the stop strings should have stopped a row early"


# ---------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------

STREAM_TEXT = "Grüße aus Köln ☃ — naïve café, 東京 and emoji 🙂 end.\nNew line: über.   spaced"


@pytest.mark.exercise("TextStreamer")
def test_streamer_prints_the_decode_a_word_at_a_time(gen, tiny):
    """Fed one token at a time on text with multi-byte characters, TextStreamer's writes put together are the
    decode of every token; no write holds a broken character, and every write but the last ends in a space or
    newline (a word is printed once it is complete). With skip_prompt, the first put is left out."""
    tok = tiny.tokenizer
    ids = tok.encode(STREAM_TEXT)
    assert any(tok.decode(ids[i : i + 1]) == "\ufffd" for i in range(len(ids))), "the text must split a character"
    out = made_beside(gen.TextStreamer, RecordingFile)  # where the streamer writes to it
    streamer = gen.TextStreamer(tok, file=out)
    streamer.put(torch.tensor([ids[:3]]))
    for token in ids[3:]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(out.chunks) == STREAM_TEXT
    assert not any("\ufffd" in chunk for chunk in out.chunks), f"a write held a broken character: {out.chunks}"
    assert all(chunk[-1] in " \n" for chunk in out.chunks[:-1]), f"writes that end mid-word: {out.chunks}"
    assert len(out.chunks) >= 8, f"expected the text a word at a time, got {len(out.chunks)} writes"

    out = made_beside(gen.TextStreamer, RecordingFile)  # where the streamer writes to it
    streamer = gen.TextStreamer(tok, skip_prompt=True, file=out)
    streamer.put(torch.tensor([ids[:4]]))
    for token in ids[4:]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(out.chunks) == tok.decode(ids[4:])


@pytest.mark.exercise("TextStreamer")
def test_generate_streams_what_it_returns(gen, demo, reference, seed):
    """generate(..., streamer=TextStreamer(...)) prints the prompt and then exactly the text it returns."""
    tok = reference.tokenizer
    out = made_beside(gen.TextStreamer, RecordingFile)  # where the streamer writes to it
    sequences = gen.generate(demo, tok, ["Grüße aus Köln, said the"], 25, seed=seed, temperature=1.5,
                             streamer=gen.TextStreamer(tok, file=out))
    assert "".join(out.chunks) == tok.decode(sequences[0], clean_up_tokenization_spaces=False)
    assert len(out.chunks) >= 2
