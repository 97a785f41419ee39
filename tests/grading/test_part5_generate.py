"""Part 5: ``generate``: batched greedy and seeded sampling against Hugging Face, scores, log-probs, per-row stopping."""

from __future__ import annotations

import io
import math

import pytest
import torch

from doubles import IdTokenizer, SuccessorModel, counted
from sampling_course.beside import made_beside
from part5_shared import (
    assert_same_tokens, hf_logits_alone, hf_processor, hf_warpers, left_padded, new_tokens_of, Part5, PROMPTS, TOL,
    with_05b_solved,
)


@pytest.fixture(autouse=True)
def later_helpers(request, impl, monkeypatch):
    """Notebook 05's exercises run with notebook 05b's functions as the solutions write them (see with_05b_solved)."""
    with_05b_solved(request, impl, monkeypatch)


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# generate: batched greedy, seeded sampling, scores
# ---------------------------------------------------------------------------------------


def hf_generate(reference, prompts: list[str], new: int, seed: int | None = None, **settings) -> torch.Tensor:
    """Oracle: Hugging Face's generate on the left-padded prompts (after torch.manual_seed(seed), when given)."""
    tok = reference.tokenizer
    ids, mask = left_padded([tok.encode(p) for p in prompts], tok.eos_token_id)
    if seed is not None:
        torch.manual_seed(seed)
    return reference.hf_model.generate(
        ids, attention_mask=mask, max_new_tokens=new, pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, **settings,
    )


@pytest.mark.exercise("generate")
def test_batched_greedy_matches_each_prompt_alone_and_hf(gen, demo, reference, oracle):
    """Greedy generate on prompts of different lengths equals Hugging Face generate with left padding
    (pad = EOS) token for token, and each row's new tokens equal that prompt generated alone."""
    new = 12
    out = gen.generate(demo, reference.tokenizer, PROMPTS, new, temperature=0.0)
    expected = oracle(hf_generate, reference, PROMPTS, new, do_sample=False)
    assert_same_tokens(out, expected, "batched greedy vs Hugging Face generate")
    width = out.shape[1] - new
    eos = reference.tokenizer.eos_token_id
    for r, prompt in enumerate(PROMPTS):
        alone = gen.generate(demo, reference.tokenizer, [prompt], new, temperature=0.0)
        mine = alone[0, -(alone.shape[1] - len(reference.tokenizer.encode(prompt))) :].tolist()
        batched = out[r, width : width + len(mine)].tolist()
        assert batched == mine, f"prompt {r} in the batch generated {batched}, alone {mine}"
        assert all(t == eos for t in out[r, width + len(mine) :].tolist())


@pytest.mark.exercise("generate")
def test_seeded_sampling_matches_hf_generate(gen, demo, reference, oracle, impl, seed):
    """Seeded sampling equals Hugging Face generate(do_sample=True, top_k=0, ...) token for token, with typical_p,
    eta_cutoff, epsilon_cutoff and num_return_sequences too.

    Conditions: Hugging Face draws one torch.multinomial(softmax(warped logits), 1) per step on the whole
    (batch, d_vocab), finished rows included, from the global generator after torch.manual_seed(seed);
    the solutions draw the same way from a generator seeded alike. (A correct sample() that draws in
    another way, e.g. by inverse CDF, gives other tokens: yours is checked by the replay test below.)"""
    if impl.package != "solutions":
        pytest.skip("exact Hugging Face parity is a property of the solutions' draw; your sample() is replayed instead")
    new = 15
    for settings in (dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
                     dict(temperature=0.9, typical_p=0.8, eta_cutoff=0.001, epsilon_cutoff=3e-4),
                     dict(temperature=1.1, top_p=0.95, num_return_sequences=2)):
        out = gen.generate(demo, reference.tokenizer, PROMPTS, new, seed=seed, **settings)
        expected = oracle(hf_generate, reference, PROMPTS, new, seed=seed, do_sample=True, **{"top_k": 0, **settings})
        assert_same_tokens(out, expected, f"seeded sampling with {settings} vs Hugging Face")


@pytest.mark.exercise("generate")
def test_seeded_sampling_replays_your_sample(gen, demo, reference, oracle, seed, device):
    """generate(seed=s) draws exactly what your own sample() draws on the true logits: one call per step on the
    whole batch with a torch.Generator on the model's device seeded with s, and rows that emitted EOS get pads from
    then on. The logits come from Hugging Face, each row run alone."""
    tok = reference.tokenizer
    new, settings = 12, dict(temperature=0.9, top_p=0.95)
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, **settings)

    rows = [tok.encode(p) for p in PROMPTS]
    generator = torch.Generator(device=device).manual_seed(seed)
    finished = [False] * len(rows)
    for _ in range(new):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        drawn = gen.sample(logits, generator=generator, **settings).tolist()
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or drawn[r] == tok.eos_token_id
        if all(finished):
            break
    width = max(len(tok.encode(p)) for p in PROMPTS)
    n_new = len(rows[0]) - len(tok.encode(PROMPTS[0]))
    expected = [row[len(tok.encode(p)) :] for row, p in zip(rows, PROMPTS)]
    assert out.shape[1] == width + n_new, f"generate returned {out.shape[1] - width} new tokens, the replay {n_new}"
    assert new_tokens_of(out, width) == expected, "generate's tokens differ from a replay of sample() on the true logits"


def what_the_scores_are(actual: torch.Tensor, raw: torch.Tensor) -> str:
    """The failure message of a scores comparison: what scores must be, and what these are when they are the raw log-probs."""
    message = ("scores differ from the log-probabilities of the distribution each token was drawn from (after the "
               "repetition penalty and, when sampling, the temperature and the filters)")
    if actual.shape == raw.shape and torch.allclose(actual, raw, **TOL, equal_nan=True):
        message += ": these are the raw model's log-probabilities (what logprobs holds)"
    return message


def oracle_scores(reference, prompts, sequences, width, settings, penalty):
    """Oracle: per row and step, the chosen token's log-prob after HF's repetition penalty and warpers, and under
    the raw logits."""
    from transformers import RepetitionPenaltyLogitsProcessor

    tok = reference.tokenizer
    warpers = hf_warpers(**{k: v for k, v in settings.items() if k != "temperature" or v != 0.0})
    scores, logprobs = torch.full(sequences[:, width:].shape, float("nan")), torch.full(sequences[:, width:].shape, float("nan"))
    for r, prompt in enumerate(prompts):
        real = tok.encode(prompt) + sequences[r, width:].tolist()
        n_prompt = len(tok.encode(prompt))
        raw_all = hf_logits_alone(reference, real)
        for step in range(sequences.shape[1] - width):
            history = torch.tensor([real[: n_prompt + step]])
            raw = raw_all[n_prompt + step - 1][None]
            processed = RepetitionPenaltyLogitsProcessor(penalty)(history, raw.clone())
            if settings.get("temperature", 1.0) != 0.0:
                processed = warpers(history, processed)
            chosen = real[n_prompt + step]
            scores[r, step] = processed.log_softmax(-1)[0, chosen]
            logprobs[r, step] = raw.log_softmax(-1)[0, chosen]
            if chosen == tok.eos_token_id:
                break
    return scores, logprobs


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("generate")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.8, top_k=30, top_p=0.9)],
                         ids=["greedy", "sampling"])
def test_scores_and_logprobs_match_a_recomputation(gen, demo, reference, oracle, seed, settings):
    """return_dict_in_generate=True: scores are the chosen tokens' log-probs after the repetition penalty and the
    warpers (at temperature 0, after the penalty only), logprobs under the raw model; both recomputed here from
    Hugging Face full forwards of each row alone. Greedy tokens also equal Hugging Face's with the same penalty."""
    tok, new, penalty = reference.tokenizer, 10, 1.3
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, repetition_penalty=penalty,
                       return_dict_in_generate=True, **settings)
    sequences = out.sequences
    width = max(len(tok.encode(p)) for p in PROMPTS)
    n_new = sequences.shape[1] - width
    assert out.scores.shape == out.logprobs.shape == (len(PROMPTS), n_new)
    scores, logprobs = oracle(oracle_scores, reference, PROMPTS, sequences, width, settings, penalty)
    torch.testing.assert_close(out.scores, scores, **TOL, equal_nan=True,
                               msg=lambda m: f"{what_the_scores_are(out.scores, logprobs)}\n{m}")
    torch.testing.assert_close(out.logprobs, logprobs, **TOL, equal_nan=True, msg=lambda m: f"logprobs.\n{m}")
    if settings["temperature"] == 0.0:
        for r, prompt in enumerate(PROMPTS):  # HF counts left pads as seen tokens, so compare rows alone
            expected = oracle(hf_generate, reference, [prompt], new, do_sample=False, repetition_penalty=penalty)[0]
            mine = sequences[r, width - len(tok.encode(prompt)) :][: expected.shape[0]]
            assert mine.tolist() == expected.tolist(), f"greedy with repetition_penalty={penalty}, prompt {r}"


def openai_penalised_greedy(reference, prompt: str, new: int, presence: float, frequency: float):
    """Oracle: greedy decoding of one prompt under OpenAI's definition of the two penalties, transcribed:

        mu[j] <- mu[j] - c[j] * frequency_penalty - float(c[j] > 0) * presence_penalty

    where c[j] is how often token j was sampled before the current position (the prompt's tokens
    are not counted). Returns the new tokens and each one's log-prob under the penalised logits;
    the logits come from Hugging Face, the row alone."""
    tok = reference.tokenizer
    ids = tok.encode(prompt)
    sampled: list[int] = []
    scores: list[float] = []
    for _ in range(new):
        mu = hf_logits_alone(reference, ids + sampled)[-1].clone()
        for j in set(sampled):
            c = sampled.count(j)
            mu[j] = mu[j] - c * frequency - float(c > 0) * presence
        token = int(mu.argmax())
        scores.append(float(mu.log_softmax(-1)[token]))
        sampled.append(token)
        if token == tok.eos_token_id:
            break
    return sampled, scores


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("generate")
def test_presence_and_frequency_penalties_count_generated_tokens_only(gen, demo, reference, oracle):
    """generate's presence and frequency penalties follow OpenAI's definition (also vLLM's): they count the tokens
    sampled so far, never the prompt's. Greedy tokens and their scores equal a transcription of that definition
    on Hugging Face's logits, each prompt alone. (The repetition penalty, Hugging Face's, counts the prompt too:
    see the scores test above.)"""
    tok, new = reference.tokenizer, 10
    for presence, frequency in ((0.0, 1.5), (2.0, 0.0), (0.7, 0.9)):
        out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, presence_penalty=presence,
                           frequency_penalty=frequency, return_dict_in_generate=True)
        width = out.sequences.shape[1] - out.scores.shape[1]
        for r, prompt in enumerate(PROMPTS):
            tokens, scores = oracle(openai_penalised_greedy, reference, prompt, new, presence, frequency)
            what = f"presence_penalty={presence}, frequency_penalty={frequency}, prompt {r}"
            mine = out.sequences[r, width : width + len(tokens)].tolist()
            assert mine == tokens, f"{what}: generated {mine}, OpenAI's definition gives {tokens}"
            torch.testing.assert_close(
                out.scores[r, : len(scores)], torch.tensor(scores), **TOL,
                msg=lambda m: f"{what}: scores differ from OpenAI's definition (do the penalties count the prompt?)\n{m}",
            )


# ---------------------------------------------------------------------------------------
# generate: per-row stopping, on a toy model
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def successor_batch(impl):
    # made where generate calls it; its calls are recorded apart, where generate cannot change the record
    model = counted(made_beside(impl.transformer, SuccessorModel, impl.transformer.KeyValueCache))
    eos = SuccessorModel(None).cfg.d_vocab - 1  # on a twin
    # Rows reach EOS after 3, 5 and 8 steps; row 2's prompt is the shortest.
    prompts = [f"1 2 {eos - 3}", f"4 5 6 7 {eos - 5}", f"{eos - 8}"]
    return model, IdTokenizer(eos), prompts, eos


@pytest.mark.exercise("generate")
def test_rows_finish_at_their_own_step(gen, successor_batch):
    """Each row stops at its own EOS, then receives pads (the EOS id) and never changes; the loop ends when the last
    row finishes, not at max_new_tokens. One prefill over the prompts, then one new position per step. Scores are
    finite up to and including the EOS step and NaN after it."""
    model, tokenizer, prompts, eos = successor_batch
    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, return_dict_in_generate=True)
    width = 5
    expected = [
        [eos - 2, eos - 1, eos, eos, eos, eos, eos, eos],
        [eos - 4, eos - 3, eos - 2, eos - 1, eos, eos, eos, eos],
        [eos - 7, eos - 6, eos - 5, eos - 4, eos - 3, eos - 2, eos - 1, eos],
    ]
    assert new_tokens_of(out.sequences, width) == expected, (
        f"new tokens {new_tokens_of(out.sequences, width)}: each row must stop at its own EOS, get pads afterwards, "
        "and the batch must run until its last row is done"
    )
    calls = [(positions, cached or 0) for positions, cached in model.calls]  # no cache: nothing cached
    assert calls[0] == (width, 0), f"the first call should be the prefill of {width} positions, got {calls[0]}"
    assert calls[1:] == [(width + i, width + i - 1) for i in range(1, 8)], (
        f"after the prefill each step should run one new position on top of the cache, got calls {calls}"
    )
    for row, steps in enumerate((3, 5, 8)):
        assert torch.isfinite(out.scores[row, :steps]).all() and torch.isfinite(out.logprobs[row, :steps]).all()
        assert torch.isnan(out.scores[row, steps:]).all() and torch.isnan(out.logprobs[row, steps:]).all(), (
            f"row {row} finished at step {steps}: its later scores and logprobs must be NaN"
        )


@pytest.mark.exercise("generate")
def test_a_criterion_stops_only_its_rows(gen, successor_batch):
    """A stopping criterion that stops row 1 only (at 7 tokens) pads row 1; the others run on to their EOS.
    MaxLengthCriteria(7) stops every row at 7 tokens."""
    model, tokenizer, prompts, eos = successor_batch

    def stop_row_1(input_ids, scores):
        stop = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        stop[1] = input_ids.shape[1] >= 7
        return stop

    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, stopping_criteria=[stop_row_1])
    rows = new_tokens_of(out, 5)
    assert rows[1] == [eos - 4, eos - 3] + [eos] * 6, f"row 1 should stop after 2 new tokens, got {rows[1]}"
    assert rows[0][:3] == [eos - 2, eos - 1, eos] and rows[2][-1] == eos and len(rows[2]) == 8
    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, stopping_criteria=[gen.MaxLengthCriteria(7)])
    assert out.shape == (3, 7), f"MaxLengthCriteria(7) should end the batch at 7 tokens, got shape {tuple(out.shape)}"


@pytest.mark.exercise("generate")
def test_generate_rejects_bad_arguments(gen, demo, reference):
    """Past n_ctx, a streamer with several prompts, an empty prompt, a string instead of a list, or a bad
    setting raise an error saying what is allowed."""
    tok, n_ctx = reference.tokenizer, reference.cfg.n_ctx
    with pytest.raises(ValueError, match=f"n_ctx={n_ctx}"):
        gen.generate(demo, tok, PROMPTS, n_ctx)
    with pytest.raises(ValueError, match="one prompt"):
        gen.generate(demo, tok, PROMPTS, 3, streamer=gen.TextStreamer(tok, file=io.StringIO()))
    with pytest.raises(ValueError, match="prompt"):
        gen.generate(demo, tok, ["fine", ""], 3)
    with pytest.raises(TypeError, match="list"):
        gen.generate(demo, tok, "a single string", 3)
    with pytest.raises(ValueError, match="top_p"):
        gen.generate(demo, tok, PROMPTS, 3, top_p=2.0)


# ---------------------------------------------------------------------------------------
# generate: the newer settings
# ---------------------------------------------------------------------------------------


def hf_greedy_alone(reference, prompt_ids: list[int], new: int, eos: int, settings: dict) -> torch.Tensor:
    """Oracle: Hugging Face's greedy generate on one prompt with ``settings`` (a ``logit_bias`` becomes its one-token
    sequence_bias), pad and end-of-text ``eos``."""
    settings = dict(settings)
    if "logit_bias" in settings:
        settings["sequence_bias"] = {(t,): b for t, b in settings.pop("logit_bias")}
    ids = torch.tensor([prompt_ids])
    return reference.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                       pad_token_id=eos, **{**settings, "eos_token_id": eos})


@pytest.mark.exercise("generate")
@pytest.mark.parametrize("settings", [
    dict(min_new_tokens=6, eos_token_id=None),
    dict(bad_words_ids=[[17], [2, 3], [371, 289]]),
    dict(logit_bias={5: 3.0, 17: -2.0, 100: 4.0, 259: -1.5}),
    dict(repetition_penalty=1.4, bad_words_ids=[[267, 417]], min_new_tokens=3, logit_bias={20: 1.0}),
], ids=["min_new_tokens", "bad_words_ids", "logit_bias", "together"])
def test_greedy_with_processors_matches_hf(gen, demo, reference, oracle, settings):
    """Greedy generate with min_new_tokens, bad_words_ids and logit_bias equals Hugging Face generate (logit_bias as
    its one-token sequence_bias), each prompt alone (Hugging Face counts left pads as seen tokens). min_new_tokens
    uses an end-of-text token that the greedy text would otherwise emit early."""
    tok, new = reference.tokenizer, 10
    settings = dict(settings)
    hf_settings = {k: v for k, v in settings.items() if k not in ("logit_bias", "eos_token_id")}
    if "logit_bias" in settings:  # as pairs: an oracle's argument keys are strings
        hf_settings["logit_bias"] = sorted(settings["logit_bias"].items())
    for prompt in PROMPTS:
        eos = tok.eos_token_id
        if "eos_token_id" in settings:  # the second greedy token of the prompt becomes the end-of-text token
            eos = int(gen.generate(demo, tok, [prompt], 2, temperature=0.0, eos_token_id=-1)[0, -1])
        ours = gen.generate(demo, tok, [prompt], new, temperature=0.0, **{**settings, "eos_token_id": eos})
        expected = oracle(hf_greedy_alone, reference, tok.encode(prompt), new, eos, hf_settings)
        assert_same_tokens(ours, expected, f"greedy with {settings}, prompt {prompt!r}")


@pytest.mark.exercise("generate")
def test_num_return_sequences_groups_copies_by_prompt(gen, demo, reference, seed, oracle, device):
    """num_return_sequences=3: 3 rows per prompt, grouped by prompt (rows 0-2 continue prompt 0, ...); at temperature 0
    the copies are the same greedy text; seeded sampling replays your sample() on the copies, one draw per step."""
    tok = reference.tokenizer
    greedy = gen.generate(demo, tok, PROMPTS, 6, temperature=0.0, num_return_sequences=3)
    alone = gen.generate(demo, tok, PROMPTS, 6, temperature=0.0)
    assert greedy.shape[0] == 3 * len(PROMPTS)
    assert torch.equal(greedy, alone.repeat_interleave(3, dim=0)), "each prompt's copies must follow it, in prompt order"
    out = gen.generate(demo, tok, PROMPTS[:2], 5, seed=seed, temperature=1.5, num_return_sequences=3)
    rows = [tok.encode(p) for p in PROMPTS[:2] for _ in range(3)]
    generator = torch.Generator(device=device).manual_seed(seed)
    finished = [False] * len(rows)
    for _ in range(5):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        drawn = gen.sample(logits, generator=generator, temperature=1.5).tolist()
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or drawn[r] == tok.eos_token_id
    width = out.shape[1] - 5
    expected = [row[-5:] for row in rows]
    assert new_tokens_of(out, width) == expected, "the copies' tokens differ from a replay of sample() on the true logits"
    assert len({tuple(r) for r in expected}) > 1, "precondition: the copies should differ at temperature 1.5"


@pytest.mark.exercise("generate")
def test_generate_with_mirostat_keeps_a_state_per_row(gen, demo, reference, seed, oracle, device):
    """generate(mirostat=2) replays your mirostat_step on the true logits after the temperature: one call per step
    on the whole batch, each row's mu starting at 2 tau and carried from step to step."""
    tok, new, tau, eta, temperature = reference.tokenizer, 8, 3.0, 0.5, 0.9
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, temperature=temperature, mirostat=2, mirostat_tau=tau,
                       mirostat_eta=eta)
    rows = [tok.encode(p) for p in PROMPTS]
    generator = torch.Generator(device=device).manual_seed(seed)
    mu = torch.full((len(rows),), 2 * tau)
    finished = [False] * len(rows)
    mus = []
    for _ in range(new):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        tempered = oracle(hf_processor, "TemperatureLogitsWarper", [temperature], None, logits)
        drawn, mu, _ = gen.mirostat_step(tempered, mu, tau, eta, generator)
        mus.append(mu.clone())
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or int(drawn[r]) == tok.eos_token_id
        if all(finished):
            break
    width = out.shape[1] - (len(rows[0]) - len(tok.encode(PROMPTS[0])))
    expected = [row[len(tok.encode(p)) :] for row, p in zip(rows, PROMPTS)]
    assert new_tokens_of(out, width) == expected, "generate's tokens differ from a replay of mirostat_step with a mu per row"
    assert len({round(float(m), 4) for m in mus[-1]}) > 1, "precondition: the rows' states should differ"


@pytest.mark.exercise("generate")
def test_logprobs_returns_the_top_k_of_the_raw_model(gen, demo, reference, oracle):
    """logprobs=5: at every step each row's 5 most likely tokens under the raw model and their log-probabilities,
    best first, recomputed here from Hugging Face's full forwards of each row alone; -1 and NaN once a row finished."""
    tok, new, k = reference.tokenizer, 6, 5
    out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, repetition_penalty=1.3, logprobs=k)
    width = out.sequences.shape[1] - new
    assert out.top_tokens.shape == out.top_logprobs.shape == (len(PROMPTS), new, k)
    for r, prompt in enumerate(PROMPTS):
        real = tok.encode(prompt) + out.sequences[r, width:].tolist()
        raw = oracle(hf_logits_alone, reference, real).log_softmax(-1)
        for step in range(new):
            values, ids = raw[len(tok.encode(prompt)) + step - 1].topk(k)
            assert out.top_tokens[r, step].tolist() == ids.tolist(), f"row {r}, step {step}: top tokens"
            torch.testing.assert_close(out.top_logprobs[r, step], values, **TOL)


@pytest.mark.exercise("generate")
def test_logprobs_with_one_filter_and_no_penalty(gen, demo, reference, oracle, seed):
    """top_k=5 at temperature 1 with logprobs=3 and nothing else: no processor makes a fresh tensor, so the
    logits the filter sees are the very tensor the log-probabilities are read from. logprobs and the top 3 are the
    raw model's, scores those of the top-5 distribution, all recomputed from Hugging Face's forward of each row
    alone. (A filter that wrote -inf into its argument would report its own filtered values as the raw ones.)"""
    tok, new = reference.tokenizer, 6
    out = gen.generate(demo, tok, PROMPTS, new, top_k=5, temperature=1.0, logprobs=3, seed=seed)
    width = out.sequences.shape[1] - out.logprobs.shape[1]
    for r, prompt in enumerate(PROMPTS):
        n_prompt = len(tok.encode(prompt))
        real = tok.encode(prompt) + out.sequences[r, width:].tolist()
        raw = oracle(hf_logits_alone, reference, real).log_softmax(-1)
        for step in range(out.logprobs.shape[1]):
            if math.isnan(float(out.logprobs[r, step])):
                break  # the row had finished
            here, chosen = raw[n_prompt + step - 1], real[n_prompt + step]
            kept = here.topk(5).indices
            assert chosen in kept.tolist(), f"row {r}, step {step}: token {chosen} is outside the top 5"
            top5 = here[kept].log_softmax(-1)[kept.tolist().index(chosen)]
            torch.testing.assert_close(out.logprobs[r, step], here[chosen], **TOL)
            torch.testing.assert_close(out.scores[r, step], top5, **TOL)
            values, ids = here.topk(3)
            assert out.top_tokens[r, step].tolist() == ids.tolist(), f"row {r}, step {step}: top tokens"
            torch.testing.assert_close(out.top_logprobs[r, step], values, **TOL)
