"""The serving bench (``sampling-course bench-serving``): its stream, its figures, its check, and exactness
against Hugging Face's continuous batching.

No timing is asserted. The course's server (part 10's ``Engine``) and Hugging Face's
``generate_batch`` must give every request the same greedy tokens on the same weights
(a random-weight GPT-2 and the story model), and both must equal Hugging Face's plain
``generate`` run on each request alone. The bench's own drivers (requests arriving over
time, the static batches' per-row budgets) must give those tokens too.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from sampling_course.apps import bench_serving
from sampling_course.apps import serving_stream as serving
from sampling_course.apps.bench_setup import QUICK_DIMS, random_gpt2
from sampling_course.config import Config
from sampling_course.implementation import impl_module
from sampling_course.sampling_settings import SamplerSettings
from sampling_course.weights import demo_state_dict

# Prompts of different lengths (two share a 9-token start), each with its own number of new tokens.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 40, 41], [3], [5, 6, 7, 8, 9, 10, 11, 12, 13, 70, 71, 72, 73, 74],
           [100, 200, 300, 400, 500, 600, 700], [17, 18]]
NEW = [12, 7, 3, 9, 1]


def random_pair(seed: int = 0):
    """A random-weight GPT-2 (Hugging Face's own initialisation) and the course's DemoTransformer on its weights."""
    hf_model = random_gpt2(QUICK_DIMS, seed)
    demo = impl_module("transformer", "solutions").DemoTransformer(Config.from_hf(hf_model.config))
    demo.load_state_dict(demo_state_dict(hf_model), strict=True)
    return demo.eval(), hf_model


@pytest.fixture(scope="module")
def pairs():
    return {"random": random_pair(), "story": bench_serving.load_models("story", "solutions", 0)[1:]}


def course_greedy(demo, prompts, new_tokens, block_size=4, n_blocks=64, max_running=16) -> list[list[int]]:
    """Every request added at once to part 10's engine, greedy, no end-of-text token."""
    engine = impl_module("engine", "solutions").Engine(demo, n_blocks, block_size, max_running)
    requests = [engine.add_request(p, n, settings=SamplerSettings(temperature=0.0)) for p, n in zip(prompts, new_tokens)]
    engine.run()
    return [list(r.output) for r in requests]


def hf_generate_alone(hf_model, prompt, new_tokens) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("model", ["random", "story"])
def test_course_server_and_hf_generate_batch_give_the_same_greedy_tokens(pairs, model):
    """``generate_batch`` (one max_new_tokens for all) against the course's engine, both against plain ``generate``."""
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    demo, hf_model = pairs[model]
    new = 10
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb_config = ContinuousBatchingConfig(page_size=4, num_blocks=64, max_batch_tokens=256, max_requests_per_batch=16)
    with serving.frozen_gc():  # only makes its cleanup faster
        results = hf_model.generate_batch(PROMPTS, generation_config=config, continuous_batching_config=cb_config)
    theirs = [list(result.generated_tokens) for result in results.values()]
    assert [list(result.prompt_ids) for result in results.values()] == PROMPTS  # in the order of the inputs
    alone = [hf_generate_alone(hf_model, p, new) for p in PROMPTS]
    assert theirs == alone
    assert course_greedy(demo, PROMPTS, [new] * len(PROMPTS)) == alone


@pytest.mark.parametrize("model", ["random", pytest.param("story", marks=pytest.mark.slow)])
def test_each_bench_driver_gives_every_request_hf_generate_s_tokens(pairs, model):
    """Requests arriving over time, each with its own length: the course's server, the static batches (a row
    stops at its own budget inside a longer batch) and HF's continuous batching all equal plain ``generate``."""
    demo, hf_model = pairs[model]
    stream = [serving.StreamRequest(p, n, 0.01 * i, False) for i, (p, n) in enumerate(zip(PROMPTS, NEW))]
    alone = [hf_generate_alone(hf_model, p, n) for p, n in zip(PROMPTS, NEW)]
    course = serving.run_course(impl_module("engine", "solutions"), demo, stream, 64, 4, 16)
    static = serving.run_static(impl_module("generate", "solutions").generate, demo, stream, 16)
    hf = serving.run_hf(hf_model, stream, 64, 4, 16, 256)
    assert course.outputs == alone
    assert static.outputs == alone
    assert hf.outputs == alone
    for served in (course, static, hf):
        assert served.cpu_seconds is not None and served.cpu_seconds > 0
        assert all(0 <= served.first[i] <= served.finish[i] for i in range(len(stream)))
        # A time for every token, in order, from the first token's to the last one's.
        for times, out, first, finish in zip(served.token_times, served.outputs, served.first, served.finish):
            assert len(times) == len(out) and times == sorted(times) and (times[0], times[-1]) == (first, finish)
        # Every prefilled position is run once, and every new token but the last once more.
        assert served.positions >= served.prefill + sum(n - 1 for n in NEW)
    # The course's server (prefix caching off) prefills every prompt position.
    assert course.positions == sum(map(len, PROMPTS)) + sum(n - 1 for n in NEW)
    assert course.prefill == sum(map(len, PROMPTS))
    # Hugging Face's shares full blocks of a common prefix (prompts 0 and 2 share two blocks of 4) when the
    # later request arrives after the earlier one's blocks are cached, which depends on the wall clock here.
    assert sum(map(len, PROMPTS)) - 8 <= hf.prefill <= sum(map(len, PROMPTS))
    assert hf.positions == hf.prefill + sum(n - 1 for n in NEW)


def test_a_small_pool_preempts_and_the_tokens_stay_the_same(pairs):
    """With room for about two requests the course's server preempts; the tokens are plain ``generate``'s."""
    demo, hf_model = pairs["random"]
    stream = [serving.StreamRequest(p, n, 0.0, False) for p, n in zip(PROMPTS, NEW)]
    course = serving.run_course(impl_module("engine", "solutions"), demo, stream, 8, 4, 16)
    assert course.n_preemptions > 0
    assert course.outputs == [hf_generate_alone(hf_model, p, n) for p, n in zip(PROMPTS, NEW)]


def test_prefix_caching_skips_the_shared_full_blocks_and_the_tokens_stay_the_same(pairs):
    """Prompts 0 and 2 share 9 tokens: two full blocks of 4. Request 0 runs first (the others arrive later),
    so with prefix caching request 2 reads those 8 positions from the cache instead of prefilling them."""
    demo, hf_model = pairs["random"]
    stream = [serving.StreamRequest(p, n, 0.0 if i == 0 else 0.2 + 0.01 * i, False)
              for i, (p, n) in enumerate(zip(PROMPTS, NEW))]
    engine = impl_module("engine", "solutions")
    cached = serving.run_course(engine, demo, stream, 64, 4, 16, prefix_caching=True)
    plain = serving.run_course(engine, demo, stream, 64, 4, 16)
    assert plain.prefill == sum(map(len, PROMPTS))
    assert cached.prefill == sum(map(len, PROMPTS)) - 8
    alone = [hf_generate_alone(hf_model, p, n) for p, n in zip(PROMPTS, NEW)]
    assert cached.outputs == plain.outputs == alone


def test_kv_in_use_counts_a_shared_block_and_its_positions_once():
    """Blocks of 4: table a holds blocks 3, 7, 1 (10 positions: 4 + 4 + 2), table b shares 3 and 7 and has its
    own 5 (9 positions: 4 + 4 + 1), table c holds 3 partly (3 positions). Four blocks, 16 places; the positions
    they hold: 4 + 4 + 2 + 1 = 11 (the requests' own counts would add up to 22, more than the room)."""
    from types import SimpleNamespace

    tables = [SimpleNamespace(blocks=[3, 7, 1], n_tokens=10), SimpleNamespace(blocks=[3, 7, 5], n_tokens=9),
              SimpleNamespace(blocks=[3], n_tokens=3)]
    assert serving.kv_in_use(tables, 4) == (4, 11)
    assert serving.kv_in_use(tables[2:], 4) == (1, 3)
    assert serving.kv_in_use([], 4) == (0, 0)


def test_kv_used_with_prefix_caching_is_the_held_blocks_fill(pairs):
    """Two 9-token prompts sharing 8 tokens, one new token each, blocks of 4, both admitted in one step: the first
    holds blocks for positions 0-3, 4-7 and 8; the second shares the first two and holds its own for position 8.
    Four blocks (16 places) hold 4 + 4 + 1 + 1 = 10 positions: KV used 10/16, KV peak 4 blocks."""
    demo, _ = pairs["random"]
    stream = [serving.StreamRequest(list(range(1, 9)) + [9], 1, 0.0, True),
              serving.StreamRequest(list(range(1, 9)) + [10], 1, 0.0, True)]
    engine = impl_module("engine", "solutions")
    served = serving.run_course(engine, demo, stream, 16, 4, 16, prefix_caching=True)
    assert served.kv_utilisation == pytest.approx(10 / 16)
    assert served.kv_peak_bytes == 4 * 4 * serving.kv_bytes_per_position(demo.cfg, torch.float32)
    assert served.prefill == 9 + 1
    plain = serving.run_course(engine, demo, stream, 16, 4, 16)
    assert plain.kv_utilisation == pytest.approx(18 / 24) and plain.outputs == served.outputs


def test_max_step_tokens_caps_every_pass_and_the_tokens_stay_the_same(pairs):
    """With at most 5 positions a step (the 14-token prompt takes several), every forward pass runs at most 5
    positions (counted by a hook on the token embedding) and the tokens are plain ``generate``'s."""
    demo, hf_model = pairs["random"]
    stream = [serving.StreamRequest(p, n, 0.0, False) for p, n in zip(PROMPTS, NEW)]
    passes = []
    hook = demo.embed.register_forward_pre_hook(lambda module, args: passes.append(args[0].numel()))
    try:
        capped = serving.run_course(impl_module("engine", "solutions"), demo, stream, 64, 4, 4, max_step_tokens=5)
    finally:
        hook.remove()
    assert passes and max(passes) <= 5 < max(map(len, PROMPTS))
    assert capped.prefill == sum(map(len, PROMPTS)) and capped.positions == capped.prefill + sum(n - 1 for n in NEW)
    assert capped.outputs == [hf_generate_alone(hf_model, p, n) for p, n in zip(PROMPTS, NEW)]


def test_main_prefix_caching_is_on_unless_turned_off():
    assert bench_serving.parse_args([]).prefix_caching
    assert not bench_serving.parse_args(["--no-prefix-caching"]).prefix_caching


def test_gap_p99_is_over_every_gap_between_consecutive_tokens():
    """A hand-made timeline. Request 0: 51 tokens, 49 gaps of 10 ms and one of 500 ms; request 1: 52 tokens, 50 gaps
    of 20 ms and one of 300 ms; both arrive long before their first token. Pooled and sorted, the 101 gaps are 49 x
    10 ms, 50 x 20 ms, 300 ms, 500 ms: the p99 (linear interpolation, position 0.99 * 100 = 99) is exactly the
    300 ms gap. A p50 or p95 gives 20 ms, the largest 500 ms; the p99 of the two per-request means
    (19.8 and 25.5 ms) is under 26 ms; counting the wait from arrival to the first token (1 s and 2 s) as a gap
    gives 103 gaps, whose p99 (position 100.98) is above 495 ms."""
    def timeline(start, gaps):
        times = [start]
        for gap in gaps:
            times.append(times[-1] + gap)
        return times

    first = timeline(1.0, [0.01] * 20 + [0.5] + [0.01] * 29)
    second = timeline(2.0, [0.02] * 10 + [0.3] + [0.02] * 40)
    assert (len(first), len(second)) == (51, 52)
    stream = [serving.StreamRequest([1], 51, 0.0, False), serving.StreamRequest([1], 52, 0.0, False)]
    served = serving.Served("course", [[0] * 51, [0] * 52], [first[0], second[0]], [first[-1], second[-1]],
                            [first, second])
    assert sorted(serving.token_gaps(served.token_times)) == pytest.approx([0.01] * 49 + [0.02] * 50 + [0.3, 0.5])
    assert serving.summarise(served, stream).gap_p99 == pytest.approx(0.3)
    no_times = serving.Served("course", served.outputs, served.first, served.finish)
    assert serving.summarise(no_times, stream).gap_p99 is None


def test_the_stream_follows_its_settings():
    stream = serving.make_stream(40, 1000, 3, 5.0, (4, 9), (2, 30), 0.25, 6)
    assert stream == serving.make_stream(40, 1000, 3, 5.0, (4, 9), (2, 30), 0.25, 6)  # seeded
    assert stream != serving.make_stream(40, 1000, 4, 5.0, (4, 9), (2, 30), 0.25, 6)
    shared = [r for r in stream if r.shared]
    assert len(shared) == 10
    system = shared[0].prompt[:6]
    assert all(r.prompt[:6] == system and 4 <= len(r.prompt) - 6 <= 9 for r in shared)
    assert all(4 <= len(r.prompt) <= 9 for r in stream if not r.shared)
    assert all(2 <= r.new_tokens <= 30 for r in stream)
    assert all(0 <= t < 999 for r in stream for t in r.prompt)  # never the last id, the end-of-text token
    arrivals = [r.arrival for r in stream]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    everyone = serving.make_stream(5, 1000, 3, None, (4, 9), (2, 30), 1.0, 6)
    assert [r.arrival for r in everyone] == [0.0] * 5 and all(r.shared for r in everyone)
    with pytest.raises(ValueError, match="prompt_lengths"):
        serving.make_stream(5, 1000, 3, None, (9, 4), (2, 30), 0.5, 6)
    with pytest.raises(ValueError, match="rate"):
        serving.make_stream(5, 1000, 3, 0.0, (4, 9), (2, 30), 0.5, 6)


def test_arrivals_are_a_poisson_process_at_the_stated_rate():
    """n exponential gaps at rate r sum to a Gamma(n, r) time: 2 r T is chi-square with 2n degrees of freedom.

    The two-sided acceptance region has a false-failure probability of 1e-6.
    """
    n, rate = 4000, 7.0
    stream = serving.make_stream(n, 50, 11, rate, (1, 1), (1, 1), 0.0, 0)
    statistic = 2 * rate * stream[-1].arrival
    assert chi2.ppf(0.5e-6, 2 * n) < statistic < chi2.ppf(1 - 0.5e-6, 2 * n)


def test_summarise_computes_the_figures_from_the_times():
    """Throughput over the whole run, TTFT from arrival, time per later token; quantiles as torch.quantile's."""
    stream = [serving.StreamRequest([1], 3, 0.0, False), serving.StreamRequest([1], 1, 1.0, False),
              serving.StreamRequest([1], 5, 2.0, False)]
    served = serving.Served("course", [[0] * 3, [0], [0] * 5], first=[0.5, 1.75, 2.25], finish=[1.5, 1.75, 5.25])
    summary = serving.summarise(served, stream)
    assert summary.tokens_per_s == pytest.approx(9 / 5.25)
    # The TTFTs are 0.5, 0.75 and 0.25; linear interpolation between order statistics.
    assert summary.ttft_p50 == pytest.approx(0.5)
    assert summary.ttft_p99 == pytest.approx(0.5 + 0.98 * 0.25)
    # Per later token: request 0 took 1.0 s for 2, request 2 took 3.0 s for 4; request 1 has none.
    assert summary.tpot_p50 == pytest.approx(0.625)
    assert summary.tpot_p99 == pytest.approx(0.5 + 0.99 * 0.25)
    assert summary.tokens_per_cpu_s is None  # no CPU time measured
    served.cpu_seconds = 3.0
    assert serving.summarise(served, stream).tokens_per_cpu_s == pytest.approx(9 / 3.0)


@pytest.mark.skipif(not hasattr(__import__("time"), "pthread_getcpuclockid"), reason="no per-thread CPU clocks here")
def test_the_cpu_clock_counts_its_thread_and_the_threads_started_after_it():
    """Two threads each spin a stated CPU time once released: one started before the clock (another engine's loop
    left behind), 0.4 s, and one started after it (an engine's own loop thread), 0.2 s; this thread spins 0.1 s.
    The clock counts 0.3 s: not the earlier thread's (the whole process's time would be 0.7 s)."""
    import threading
    import time

    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    go, finish = threading.Event(), threading.Event()

    def worker(seconds):
        go.wait()
        spin(seconds)
        finish.wait()  # alive until the clock is read, as an engine's loop is

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = threading.Thread(target=worker, args=(0.4,), daemon=True)
        before.start()
        clock = serving.CpuClock()
        after = threading.Thread(target=worker, args=(0.2,), daemon=True)
        after.start()
        clock.threads_started_since()
        go.set()
        spin(0.1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
            time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in (before, after)) < 0.6:
            time.sleep(0.01)
        seconds = clock.seconds()
    finally:
        finish.set()
        torch.set_num_threads(threads)
    assert clock.per_thread
    assert 0.3 <= seconds < 0.45


def test_the_cpu_table_gives_each_round_s_ratios_per_cpu_second(capsys):
    """Two rounds, 90 tokens each: course 1 s and 2 s of CPU, static 3 s and 3 s, HF 2 s and 2 s. Per CPU second the
    course is 3x and 1.5x the static engine (median 2.25x, spread 1.50-3.00) and 2x and 1x Hugging Face."""
    from rich.console import Console

    stream = [serving.StreamRequest([1], 90, 0.0, False)]

    def summary(cpu):
        served = serving.Served("x", [[0] * 90], first=[0.5], finish=[1.0], cpu_seconds=cpu)
        return serving.summarise(served, stream)

    summaries = {"course": [summary(1.0), summary(2.0)], "static": [summary(3.0), summary(3.0)],
                 "hf": [summary(2.0), summary(2.0)]}
    Console(width=200).print(bench_serving.cpu_table(summaries))
    out = capsys.readouterr().out
    course = next(line for line in out.splitlines() if "course" in line)
    for cell in ("1.50", "1.00-2.00", "2.25x", "1.50-3.00", "1.50x", "1.00-2.00"):
        assert cell in course
    line = bench_serving.round_ratios(summaries, "tokens_per_cpu_s")
    assert "course / static: 3.00x 1.50x" in line and "course / HF: 2.00x 1.00x" in line


def test_the_check_names_an_engine_that_differs():
    stream = [serving.StreamRequest([1, 2], 3, 0.0, False), serving.StreamRequest([3], 2, 0.0, False)]

    def served(engine, outputs):
        return serving.Served(engine, outputs, [0.0, 0.0], [1.0, 1.0])

    bench_serving.check_same(stream, {"course": served("course", [[1, 2, 3], [4, 5]]),
                                      "hf": served("hf", [[1, 2, 3], [4, 5]])})
    with pytest.raises(bench_serving.BenchCheckError, match=r"HF continuous batching: request 1 differs .* token 1"):
        bench_serving.check_same(stream, {"course": served("course", [[1, 2, 3], [4, 5]]),
                                          "hf": served("hf", [[1, 2, 3], [4, 6]])})
    with pytest.raises(bench_serving.BenchCheckError, match=r"static batches .*: request 0 got 2 tokens, asked for 3"):
        bench_serving.check_same(stream, {"course": served("course", [[1, 2, 3], [4, 5]]),
                                          "static": served("static", [[1, 2], [4, 5]])})


@pytest.mark.parametrize("argv, message", [
    (["--prompt-lengths", "9-4"], "--prompt-lengths must look like 8-64"),
    (["--shared", "1.5"], "--shared must be"),
    (["--model", "story", "--output-lengths", "500-500"], "more than the model's n_ctx=512"),
    (["--blocks", "4", "--block-size", "16"], "needs 14 blocks of 16, more than --blocks 4"),
    (["--max-step-tokens", "8", "--max-running", "16"], "--max-step-tokens (8) must be at least --max-running (16)"),
    (["--max-step-tokens", "0"], "--max-step-tokens"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert bench_serving.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_main_quick_prints_the_tables(capsys, monkeypatch):
    """`sampling-course bench-serving --quick` checks the tokens, exits 0 and prints both tables."""
    monkeypatch.setenv("COLUMNS", "200")  # every header on one line
    assert bench_serving.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "checked:" in out and "Serving 6 requests" in out and "Work and KV memory" in out
    for cell in ("course", "static", "HF", "x static", "x HF", "TTFT p99", "KV peak MiB", "load average",
                 "tok/CPU-s", "per round, CPU seconds"):
        assert cell in out
    assert "chunked" not in out.split("course: part 10's server")[0], "no chunked row without --max-step-tokens"
    assert bench_serving.main(["--quick", "--no-hf", "--max-step-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "checked:" in out and "│ chunked" in out and "at most 16 positions a step" in out
