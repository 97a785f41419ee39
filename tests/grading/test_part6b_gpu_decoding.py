"""Part 6b: fast decoding on a GPU: a decode step with fixed shapes, sampling without a host
synchronisation, and a loop that looks at finished rows every few steps.

How the tests judge (all of it runs on the CPU; the few checks that need a CUDA GPU skip
with a one-line reason elsewhere):

* ``fixed_shape_step`` (the model's one forward pass on a ``FixedShapeCache``) starts from
  keys and values that Hugging Face computed for a prompt (its own cache, copied into the
  buffer), so no other cache's code is involved; every slot the step has not written holds
  large finite numbers, so a step that attends to one is far off. Fed one token at a time, its logits must equal Hugging Face's full forward
  at that position, and the buffer must then hold Hugging Face's keys and values exactly
  where the tokens went. That it can be captured is checked by recording every operation
  it runs (``sampling_course.op_recorder.OpRecorder``, which records in the process where the
  code runs): at two positions the same operations on the same shapes, and no operation that
  reads a value back to the host. Graded in a sandbox, that record is made in the submission's
  process, which could change it: a verdict on it (these, and the host reads of ``race_sample`` and
  ``decode_loop``) that fails counts; in class grading a test in which one holds earns nothing
  (``OpRecorder.verdict``).
* ``race_sample`` is statistical: one call on many rows of the same logits, each token's
  count within its exact binomial interval (Bonferroni over tokens and tails), so a correct
  sampler fails with probability at most ``ALPHA`` = 1e-6. The law it must follow is
  softmax(logits), which is ``torch.multinomial``'s. Support is checked apart from
  frequencies. It must draw from the generator it is given and read nothing back to the host.
* ``decode_loop`` runs a scripted step whose rows end at known steps
  (``sampling_course.scripted_step``, made beside the code under test; its calls counted
  where that code cannot change the count, ``doubles.counted_calls``), against the loop that
  looks after every step, transcribed here: the same tokens, the number of steps the rule
  implies, and few host reads.
* ``CapturedDecoder`` (written for the learner) must give Hugging Face's greedy ``generate``,
  end token, padding and early stop included.

Random inputs come from ``SAMPLING_COURSE_TEST_SEED``.
"""

from __future__ import annotations

import math

import pytest
import torch

from sampling_course.beside import made_beside
from sampling_course.grading.tolerances import parity
from sampling_course.op_recorder import OpRecorder
from sampling_course.scripted_step import ScriptedStep

from doubles import counted_calls
from quantiles import binom_isf, binom_ppf

TOL = parity()
ALPHA = 1e-6  # the false-failure probability of every statistical test below

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (runs with pytest --device cuda on a machine with one)"
)


@pytest.fixture(scope="module")
def gpu(impl):
    return impl.gpu_decoding


def random_tokens(seed: int, batch: int, length: int, d_vocab: int) -> torch.Tensor:
    return torch.randint(0, d_vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------
# fixed_shape_step
# ---------------------------------------------------------------------------------------


def hf_keys_values(reference, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Oracle: Hugging Face's logits for every position, and its keys and values as (n_layers, batch, pos, n_heads, d_head)."""
    with torch.no_grad():
        out = reference.hf_model(tokens, use_cache=True)
    layers = out.past_key_values.layers
    keys = torch.stack([layer.keys for layer in layers]).transpose(2, 3)
    values = torch.stack([layer.values for layer in layers]).transpose(2, 3)
    return out.logits, keys, values


def garbage_buffer(seed: int, cfg, batch: int, max_len: int) -> torch.Tensor:
    """A static cache's buffer full of large finite numbers: attending to an unwritten slot shows."""
    shape = (cfg.n_layers, 2, batch, max_len, cfg.n_heads, cfg.d_head)
    return 30.0 * torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1))


@pytest.mark.downstream  # the step is the model's own forward: also run on every correct part-1/4 variant planted
@pytest.mark.exercise("fixed_shape_step")
@pytest.mark.parametrize("batch", [1, 3])
def test_fixed_shape_step_gives_hugging_faces_logits_and_keys(reference, demo, impl, gpu, batch, seed, oracle):
    """One token per call at positions 5..8 on top of HF's cache of the first 5: HF's logits, and HF's
    keys and values written at exactly those slots, the later slots untouched."""
    cfg = demo.cfg
    prompt, steps, max_len = 5, 4, 12
    tokens = random_tokens(seed, batch, prompt + steps, cfg.d_vocab)
    logits, keys, values = oracle(hf_keys_values, reference, tokens)
    buffer = garbage_buffer(seed, cfg, batch, max_len)
    untouched = buffer[:, :, :, prompt + steps :].clone()
    buffer[:, 0, :, :prompt], buffer[:, 1, :, :prompt] = keys[:, :, :prompt], values[:, :, :prompt]
    with torch.no_grad():
        for t in range(prompt, prompt + steps):
            out = gpu.fixed_shape_step(demo, buffer, tokens[:, t], torch.tensor(t))
            assert out.shape == (batch, cfg.d_vocab), "fixed_shape_step returns the new token's logits: (batch, d_vocab)"
            torch.testing.assert_close(out, logits[:, t], **TOL, msg=lambda m: f"logits at position {t}: {m}")
    torch.testing.assert_close(buffer[:, 0, :, : prompt + steps], keys, **TOL, msg=lambda m: f"keys in the buffer: {m}")
    torch.testing.assert_close(buffer[:, 1, :, : prompt + steps], values, **TOL, msg=lambda m: f"values in the buffer: {m}")
    assert torch.equal(buffer[:, :, :, prompt + steps :], untouched), "the step writes slot `position` only"


@pytest.mark.exercise("fixed_shape_step")
def test_fixed_shape_step_is_the_same_work_at_every_position(tiny_demo, impl, gpu, seed):
    """What a CUDA graph needs: the same operations on the same shapes at positions 5 and 9, and nothing
    read back to the host (no int(position), .item(), nonzero or other data-dependent shape)."""
    cfg = tiny_demo.cfg
    buffer = garbage_buffer(seed, cfg, 2, 16)
    tokens = random_tokens(seed, 2, 1, cfg.d_vocab)[:, 0]
    recorded = []
    with torch.no_grad():
        for position in (5, 9):
            position = torch.tensor(position)
            with OpRecorder() as recorder:
                gpu.fixed_shape_step(tiny_demo, buffer, tokens, position)
            recorder.verdict(not recorder.host_reads(), (
                f"the step reads values back to the host ({', '.join(recorder.host_reads())}): a captured step cannot; "
                "keep the position a tensor and index with it"
            ))
            recorded.append(recorder.ops)
    recorder.verdict(recorded[0] == recorded[1], "the step must run the same operations on the same shapes at every position")


# ---------------------------------------------------------------------------------------
# race_sample
# ---------------------------------------------------------------------------------------

# softmax over the first 9: ~[.064 .014 .349 .116 .032 .212 .004 .047 .142]; the last token can never be drawn.
LOGITS = torch.tensor([0.3, -1.2, 2.0, 0.9, -0.4, 1.5, -2.5, 0.0, 1.1, float("-inf")])
# The same values in other places, for a second group of rows in one batch.
LOGITS_2 = LOGITS[torch.tensor([7, 2, 9, 5, 0, 1, 8, 3, 6, 4])]
N_ROWS = 20_000


def global_rng_state(device: torch.device) -> torch.Tensor:
    """The state of torch's global generator on ``device``: the one a draw there without a generator uses."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.mps.get_rng_state()
    return torch.get_rng_state()


def assert_draws_follow(draws: torch.Tensor, probs: torch.Tensor, what: str, alpha: float = ALPHA) -> None:
    """Support first, then each supported token's count within [ppf(q), isf(q)] of Binomial(n, p),
    q = alpha / (2 * supported tokens): a correct sampler fails with probability at most alpha."""
    n, d_vocab = draws.numel(), probs.shape[-1]
    assert draws.min() >= 0 and draws.max() < d_vocab, f"{what}: token ids outside [0, {d_vocab})"
    observed = torch.bincount(draws.flatten().cpu(), minlength=d_vocab)
    support = (probs > 0).nonzero().flatten().tolist()
    outside = {t: int(observed[t]) for t in range(d_vocab) if observed[t] > 0 and t not in support}
    assert not outside, f"{what}: drew tokens of probability 0 (token: count) {outside}"
    q = alpha / (2 * len(support))
    problems = []
    for token in support:
        p = probs[token].item()
        low, high = binom_ppf(q, n, p), binom_isf(q, n, p)
        if not low <= observed[token] <= high:
            problems.append(f"token {token}: frequency {observed[token].item() / n:.4f}, expected {p:.4f} "
                            f"(acceptable count range [{low:.0f}, {high:.0f}] of {n})")
    assert not problems, f"{what}: frequencies differ from softmax(logits)\n" + "\n".join(problems)


@pytest.mark.exercise("race_sample")
def test_race_sample_draws_with_torch_multinomials_law(gpu, seed):
    """Many rows of the same logits, one call: each token as often as softmax(logits) says, which is the law of
    torch.multinomial(softmax(logits), 1). Binomial bounds with Bonferroni: false-failure probability <= 1e-6."""
    torch.manual_seed(seed)
    draws = gpu.race_sample(LOGITS.expand(N_ROWS, -1))
    assert draws.shape == (N_ROWS,) and not draws.dtype.is_floating_point, (
        f"race_sample returns one token id per row: an integer tensor of shape (batch,), got {draws.dtype} {tuple(draws.shape)}"
    )
    assert_draws_follow(draws, torch.softmax(LOGITS.double(), -1), "race_sample")


@pytest.mark.exercise("race_sample")
def test_race_sample_rows_follow_their_own_logits(gpu, seed, device):
    """Rows with different logits in one batch, in alternation: each group follows its own softmax.
    Binomial bounds with Bonferroni, alpha / 2 per group: false-failure probability <= 1e-6."""
    logits = torch.stack([LOGITS, LOGITS_2]).repeat(N_ROWS // 2, 1)
    draws = gpu.race_sample(logits, generator=torch.Generator(device=device).manual_seed(seed))
    for group, row in ((0, LOGITS), (1, LOGITS_2)):
        assert_draws_follow(draws[group::2], torch.softmax(row.double(), -1), f"race_sample, rows like row {group}", ALPHA / 2)


@pytest.mark.exercise("race_sample")
def test_race_sample_draws_from_the_generator_it_is_given(gpu, seed, device):
    """The same seeded generator gives the same tokens whatever torch's global generator did, and the global
    generator (the one of the device the draw runs on) is left alone."""
    logits = LOGITS.expand(64, -1)
    generator = torch.Generator(device=device).manual_seed(seed)
    first = gpu.race_sample(logits, generator=generator)
    torch.rand(100)  # the global generator moves on (on the grading device, where the test's tensors are made)
    before = global_rng_state(device)
    again = gpu.race_sample(logits, generator=generator.manual_seed(seed))
    assert torch.equal(first, again), "race_sample must draw from the generator it is given (same seed, same tokens)"
    assert torch.equal(before, global_rng_state(device)), "with a generator, race_sample must leave torch's global generator alone"


@pytest.mark.exercise("race_sample")
def test_race_sample_reads_nothing_back_to_the_host(gpu, seed, device):
    """No .item(), no data-dependent shapes, and not torch.multinomial (the exercise is to draw without it: it has
    checked its input with values read back to the host)."""
    with OpRecorder() as recorder:
        gpu.race_sample(LOGITS.expand(8, -1), generator=torch.Generator(device=device).manual_seed(seed))
    recorder.verdict(not recorder.host_reads(), (
        f"race_sample makes the host wait for the device ({', '.join(recorder.host_reads())}); draw with "
        "element-wise operations and an argmax"
    ))


@pytest.mark.exercise("race_sample")
def test_race_sample_refuses_what_is_not_a_batch_of_logits(gpu):
    with pytest.raises(ValueError, match=r"shape \(batch, d_vocab\)"):
        gpu.race_sample(LOGITS)


# ---------------------------------------------------------------------------------------
# decode_loop
# ---------------------------------------------------------------------------------------

EOS, PAD = 99, 0


def looking_after_every_step(ends: list[int | None], max_new_tokens: int) -> tuple[torch.Tensor, int]:
    """The reference: look after every step, stop when every row has ended. Returns the tokens and the steps run."""
    step, columns = ScriptedStep(ends, EOS, PAD), []
    for _ in range(max_new_tokens):
        columns.append(step().clone())
        if all(step.done):
            break
    return torch.stack(columns, dim=1), step.calls


CASES = {
    "rows-end-at-2-5-3": ([2, 5, 3], 12),
    "never-ends": ([None, 4], 7),
    "ends-at-the-last-step": ([6, 1], 7),
    "ends-at-once": ([0, 0], 9),
}


@pytest.mark.exercise("decode_loop")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("check_every", [1, 3, 4, 50])
def test_decode_loop_gives_the_tokens_of_a_loop_that_looks_every_step(gpu, case, check_every):
    """The same tokens as looking after every step, after exactly the steps the rule implies: the first
    multiple of check_every at or after the step where the last row ended (at most max_new_tokens)."""
    ends, max_new_tokens = case
    expected, steps_needed = looking_after_every_step(ends, max_new_tokens)
    scripted = made_beside(gpu, ScriptedStep, ends, EOS, PAD)  # where decode_loop runs: it marks finished there
    step = counted_calls(scripted)  # its calls are counted apart, where decode_loop cannot change the count
    with OpRecorder() as recorder:
        got = gpu.decode_loop(step, scripted.finished, max_new_tokens, check_every)
    assert isinstance(got, torch.Tensor) and got.shape[0] == len(ends), "decode_loop returns (batch, new) tokens"
    assert torch.equal(got, expected), f"tokens {got.tolist()}, expected {expected.tolist()}"
    ended = all(end is not None and end < max_new_tokens for end in ends)
    calls = min(max_new_tokens, check_every * math.ceil(steps_needed / check_every)) if ended else max_new_tokens
    ran = step.calls
    assert ran == calls, (
        f"step() ran {ran} times; looking at finished every {check_every} steps, the loop must stop at the "
        f"first look after every row has ended: after {calls} steps"
    )
    looks = calls // check_every
    recorder.verdict(len(recorder.host_reads()) <= looks + 3, (
        f"decode_loop read the device {len(recorder.host_reads())} times in {calls} steps; it may look every "
        f"{check_every} steps ({looks} times) and once or twice at the end"
    ))


@pytest.mark.exercise("decode_loop")
def test_decode_loop_of_no_steps_and_bad_arguments(gpu):
    scripted = made_beside(gpu, ScriptedStep, [3], EOS, PAD)
    step = counted_calls(scripted)
    assert gpu.decode_loop(step, scripted.finished, 0).shape == (1, 0) and step.calls == 0
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="check_every"):
            gpu.decode_loop(step, scripted.finished, 4, bad)


def hf_greedy_ids(reference, prompts: torch.Tensor, eos: int | None, new: int = 10) -> torch.Tensor:
    """Oracle: Hugging Face's greedy generate on unpadded prompts, pads PAD, end-of-text ``eos`` (None: none)."""
    return reference.hf_model.generate(prompts, eos_token_id=eos, max_new_tokens=new, do_sample=False, pad_token_id=PAD,
                                       attention_mask=torch.ones_like(prompts))


@pytest.mark.exercise("decode_loop")
@pytest.mark.parametrize("check_every", [1, 4])
def test_captured_decoder_gives_hugging_faces_greedy_generate(tiny, tiny_demo, gpu, check_every, seed, device, oracle):
    """The whole decoder (eager here): HF's greedy tokens for 3 prompts, one row ending early at the end
    token and padded after it, and the batch stopping when every row has ended."""
    prompts = random_tokens(seed, 3, 6, tiny.cfg.d_vocab).to(device)
    free = oracle(hf_greedy_ids, tiny, prompts, None)
    eos = int(free[1, 6 + 3])  # row 1's fourth new token ends it
    expected = oracle(hf_greedy_ids, tiny, prompts, eos)
    decoder = gpu.CapturedDecoder(tiny_demo, 3, 16, eos_token_id=eos, pad_token_id=PAD)
    got = decoder.generate(prompts, 10, check_every=check_every)
    assert torch.equal(got, expected), f"tokens\n{got.tolist()}\nHugging Face\n{expected.tolist()}"
    # Three copies of one prompt whose first new token is the end token: the batch stops right there.
    same = prompts[:1].repeat(3, 1)
    eos_now = int(free[0, 6])
    decoder = gpu.CapturedDecoder(tiny_demo, 3, 16, eos_token_id=eos_now, pad_token_id=PAD)
    expected = oracle(hf_greedy_ids, tiny, same, eos_now)
    assert expected.shape == (3, 7)
    assert torch.equal(decoder.generate(same, 10, check_every=check_every), expected)


@pytest.mark.exercise("decode_loop")
def test_captured_decoder_samples_reproducibly_and_refuses_bad_settings(tiny_demo, gpu, seed, device):
    prompts = random_tokens(seed, 2, 4, tiny_demo.cfg.d_vocab).to(device)
    decoder = gpu.CapturedDecoder(tiny_demo, 2, 12, temperature=1.0)
    torch.manual_seed(seed)
    first = decoder.generate(prompts, 6)
    torch.manual_seed(seed)
    assert torch.equal(decoder.generate(prompts, 6), first) and first.shape == (2, 10)
    with pytest.raises(ValueError, match="max_len"):
        decoder.generate(prompts, 9)
    with pytest.raises(ValueError, match="max_len must be"):
        gpu.CapturedDecoder(tiny_demo, 2, tiny_demo.cfg.n_ctx + 1)
    if device.type != "cuda":
        with pytest.raises(ValueError, match="capture=True needs the model on a CUDA GPU"):
            gpu.CapturedDecoder(tiny_demo, 2, 12, capture=True)


# ---------------------------------------------------------------------------------------
# On a CUDA GPU: capture, and no waiting
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_pair(impl):
    from sampling_course.implementation import load_demo
    from sampling_course.reference import load_reference

    reference = load_reference("tiny", "cuda")
    return reference, load_demo(reference, impl.transformer)


@needs_cuda
@pytest.mark.exercise("fixed_shape_step")
def test_the_captured_step_replays_the_eager_tokens(cuda_pair, gpu, seed):
    """CUDA graph replays give the eager step's tokens, which are Hugging Face's greedy tokens (fp32, no TF32)."""
    from sampling_course.devices import full_fp32_precision

    reference, model = cuda_pair
    prompts = random_tokens(seed, 4, 8, reference.cfg.d_vocab).cuda()
    with full_fp32_precision():
        captured = gpu.CapturedDecoder(model, 4, 40, capture=True).generate(prompts, 24)
        eager = gpu.CapturedDecoder(model, 4, 40, capture=False).generate(prompts, 24)
        with torch.no_grad():
            expected = reference.hf_model.generate(
                prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=24, do_sample=False,
                eos_token_id=None, pad_token_id=PAD,
            )
    assert torch.equal(eager, expected) and torch.equal(captured, eager)


@needs_cuda
@pytest.mark.exercise("fixed_shape_step")
def test_replaying_the_step_never_waits_for_the_host(cuda_pair, gpu, seed):
    reference, model = cuda_pair
    decoder = gpu.CapturedDecoder(model, 2, 32, capture=True)
    decoder.prefill(random_tokens(seed, 2, 4, reference.cfg.d_vocab).cuda())
    decoder.step()  # the first call captures (capturing may wait); the replays below must not
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            decoder.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
@pytest.mark.exercise("race_sample")
def test_race_sample_never_waits_for_the_host_on_a_gpu(gpu, seed):
    logits = LOGITS.cuda().expand(16, -1)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu.race_sample(logits, generator=generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")
