"""What ``sampling-course bench-serving`` runs: a synthetic request stream and three engines that serve it.

``make_stream`` draws the stream from a seed: arrival times (a Poisson process at a stated
rate, or every request at t = 0), prompt and output lengths (each uniform over a stated
range of integers), and a stated share of requests whose prompt starts with one common
system prompt. Token ids are drawn uniformly from the vocabulary without its last id (the
end-of-text token of every model here), and no engine stops at an end-of-text token: each
request generates exactly the tokens it asks for, so every engine does the same work.

Each ``run_*`` serves one stream in real time (a request is handed to the engine only once
its arrival time has passed) and returns a ``Served``: every request's tokens and the time
each of them was ready, the positions the model ran, and the KV memory held.

* ``run_course``: part 10's ``Engine`` (continuous batching over a paged cache), stepped
  until every request is done;
* ``run_static``: part 5's ``generate`` on fixed batches: whenever it is free it takes up to
  ``max_batch`` requests that have arrived and runs them to the end of the longest; a row
  stops on its own budget (a stopping criterion) but keeps its slot. Its tokens count as
  ready at the step that made them, as if it streamed;
* ``run_hf``: Hugging Face's continuous batching (the manager behind ``generate_batch``),
  fed request by request with ``add_request`` while its loop runs in its own thread.

Times are seconds from the moment the engine was ready (its cache allocated, the model warm).
Each run also counts the CPU seconds its engine spent from that moment until its last token
(``CpuClock``: the threads that run it), a measure that other programs on a busy machine disturb
far less than the wall clock.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sampling_course.apps.bench_setup import IdTokenizer


@dataclass(frozen=True)
class StreamRequest:
    prompt: list[int]
    new_tokens: int
    arrival: float  # seconds after the start
    shared: bool  # whether the prompt starts with the common system prompt


def make_stream(n_requests: int, vocab: int, seed: int, rate: float | None, prompt_lengths: tuple[int, int],
                output_lengths: tuple[int, int], shared_fraction: float, system_length: int) -> list[StreamRequest]:
    """``n_requests`` requests in arrival order; ``rate`` None puts every arrival at 0 (an offline batch).

    Arrival gaps are exponential with mean ``1 / rate`` (a Poisson process). A request's own
    prompt has ``prompt_lengths`` (inclusive range) tokens; ``round(shared_fraction * n_requests)``
    requests, chosen at random, have the ``system_length``-token system prompt in front of it.
    """
    if n_requests < 1:
        raise ValueError(f"n_requests must be >= 1, got {n_requests}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 requests per second (or None: all at t = 0), got {rate}")
    for name, (low, high) in (("prompt_lengths", prompt_lengths), ("output_lengths", output_lengths)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} must be a range 1 <= low <= high, got {low}-{high}")
    if not 0 <= shared_fraction <= 1:
        raise ValueError(f"shared_fraction must be in [0, 1], got {shared_fraction}")
    rng = random.Random(seed)
    system = [rng.randrange(vocab - 1) for _ in range(system_length)]
    shared = set(rng.sample(range(n_requests), round(shared_fraction * n_requests)))
    stream, clock = [], 0.0
    for i in range(n_requests):
        clock += 0.0 if rate is None else rng.expovariate(rate)
        own = [rng.randrange(vocab - 1) for _ in range(rng.randint(*prompt_lengths))]
        stream.append(StreamRequest((system if i in shared else []) + own, rng.randint(*output_lengths), clock,
                                    i in shared))
    return stream


@dataclass
class Served:
    """One engine's run over a stream; lists are indexed like the stream."""

    engine: str
    outputs: list[list[int]]
    first: list[float]  # when each request's first token was ready
    finish: list[float]  # when its last token was ready
    token_times: list[list[float]] | None = None  # when each of its tokens was ready (None: not recorded)
    positions: int = 0  # positions run through the model, padding and finished rows included
    prefill: int = 0  # of those, the positions of prompts (and of recomputed tokens after a preemption)
    kv_peak_bytes: float | None = None  # the most KV memory held at once
    # Positions held / positions the held memory has room for, summed over the steps; a shared block and its
    # positions count once (``kv_in_use``), so this is at most 1.
    kv_utilisation: float | None = None
    n_preemptions: int = 0
    cpu_seconds: float | None = None  # CPU time of the whole process (every thread) from the start to the last token


class CpuClock:
    """The CPU seconds the threads that run an engine have spent since ``start``: this thread, and the
    Python threads started after the clock (``threads_started_since``: Hugging Face's loop thread).

    Counted per thread, not for the whole process: a thread another engine left behind (a loop that
    was slow to stop) would otherwise be billed to the next engine. Torch's own worker threads are
    not Python threads; with more than one torch thread, or where a thread's CPU clock cannot be read,
    the clock counts the whole process (``time.process_time``) instead.
    """

    def __init__(self):
        self.per_thread = torch.get_num_threads() == 1 and hasattr(time, "pthread_getcpuclockid")
        self.before = {thread.ident for thread in threading.enumerate()}
        self.others: dict[int, float] = {}
        self.started = time.thread_time() if self.per_thread else time.process_time()

    def threads_started_since(self) -> None:
        """Start counting the threads started since the clock was made (call once they have started)."""
        if not self.per_thread:
            return
        for thread in threading.enumerate():
            if thread.ident not in self.before and thread.ident not in self.others and thread.is_alive():
                try:
                    self.others[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, ValueError):
                    pass  # it has just ended

    def seconds(self) -> float:
        """CPU seconds so far; read it while the counted threads still run."""
        if not self.per_thread:
            return time.process_time() - self.started
        total = time.thread_time() - self.started
        for ident, start in self.others.items():
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(ident)) - start
            except (OSError, ValueError):
                pass  # it ended before the clock was read: its time is lost, so read while it runs
        return total


class PositionCounter:
    """A forward pre-hook on a module that every position of a forward pass goes through once, its input
    (batch, positions, ...): counts positions (and calls ``each``). The course's engines are watched at their
    token embedding (``model.embed``, which both call on the token ids they run), Hugging Face's at its first
    LayerNorm."""

    def __init__(self, module: torch.nn.Module, each=None):
        self.positions, self.prefill_positions, self.each = 0, 0, each
        self.handle = module.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        batch, seq = args[0].shape[:2]
        self.positions += batch * seq
        if seq > 1:  # a prompt's pass (part 5's engine runs prefill and decode apart)
            self.prefill_positions += batch * seq
        if self.each is not None:
            self.each()

    def remove(self):
        self.handle.remove()


def sleep_until(t0: float, when: float) -> None:
    delay = t0 + when - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def kv_bytes_per_position(cfg, dtype: torch.dtype) -> int:
    """Keys and values of one position in every layer."""
    return cfg.n_layers * 2 * cfg.n_heads * cfg.d_head * torch.empty(0, dtype=dtype).element_size()


def kv_in_use(tables, block_size: int) -> tuple[int, int]:
    """The blocks ``tables`` hold and the positions those blocks hold, each counted once.

    A block shared by several tables (a common prefix) is one block of memory, and its
    positions are held once however many requests read them: a block holds, of its
    ``block_size`` positions, as many as its fullest holder fills.
    """
    filled: dict[int, int] = {}
    for table in tables:
        for index, block in enumerate(table.blocks):
            fill = min(block_size, table.n_tokens - index * block_size)
            filled[block] = max(filled.get(block, 0), fill)
    return len(filled), sum(filled.values())


def run_course(engine_module, model, stream: list[StreamRequest], n_blocks: int, block_size: int,
               max_running: int, prefix_caching: bool = False, max_step_tokens: int | None = None) -> Served:
    """Part 10's engine: requests join at their arrival, the engine steps while any is waiting or running.
    With ``prefix_caching`` a prompt's blocks computed earlier are read, not prefilled again; with
    ``max_step_tokens`` no step runs more positions (long prompts are prefilled in chunks)."""
    from sampling_course.sampling_settings import SamplerSettings

    engine = engine_module.Engine(model, n_blocks, block_size, max_running, prefix_caching=prefix_caching,
                                  max_step_tokens=max_step_tokens)
    greedy = SamplerSettings(temperature=0.0)
    per_position = kv_bytes_per_position(model.cfg, model.embed.W_E.dtype)
    peak, held_sum, room_sum = 0, 0, 0

    def during_forward():  # the blocks every running request holds while the step runs
        nonlocal peak, held_sum, room_sum
        blocks, positions = kv_in_use([request.table for request in engine.scheduler.running], block_size)
        peak = max(peak, blocks)
        held_sum += positions
        room_sum += blocks * block_size

    counter = PositionCounter(model.embed, during_forward)
    n = len(stream)
    requests, first, finish, times = [None] * n, [None] * n, [None] * n, [[] for _ in range(n)]
    pending, active = deque(range(n)), []
    t0, clock = time.perf_counter(), CpuClock()
    try:
        while pending or active:
            now = time.perf_counter() - t0
            while pending and stream[pending[0]].arrival <= now:
                i = pending.popleft()
                requests[i] = engine.add_request(stream[i].prompt, stream[i].new_tokens, settings=greedy)
                active.append(i)
            if not active:
                sleep_until(t0, stream[pending[0]].arrival)
                continue
            engine.step()
            now = time.perf_counter() - t0
            for i in list(active):
                times[i] += [now] * (len(requests[i].output) - len(times[i]))  # this step's token, if it drew one
                if first[i] is None and requests[i].output:
                    first[i] = now
                if requests[i].finished:
                    finish[i] = now
                    active.remove(i)
        cpu = clock.seconds()
    finally:
        counter.remove()
    outputs = [list(request.output) for request in requests]
    decoded = sum(len(out) - 1 for out in outputs)  # every token but the last is run once as a decode position
    return Served("course", outputs, first, finish, times, counter.positions, counter.positions - decoded,
                  peak * block_size * per_position, held_sum / room_sum if room_sum else None,
                  sum(request.n_preemptions for request in requests), cpu)


class RowBudgets:
    """A stopping criterion for part 5's ``generate``: row ``i`` stops after ``budgets[i]`` new tokens.

    It also notes when each step's tokens were ready (it is called once per step, after the draw).
    """

    def __init__(self, budgets: list[int], width: int, t0: float):
        self.budgets, self.width, self.t0 = torch.tensor(budgets), width, t0
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter() - self.t0)
        return (input_ids.shape[1] - self.width >= self.budgets).to(input_ids.device)


def run_static(generate, model, stream: list[StreamRequest], max_batch: int) -> Served:
    """Part 5's engine on fixed batches: the requests that have arrived (up to ``max_batch``) start together
    and the batch holds its rows until its longest request is done."""
    tokenizer = IdTokenizer()
    per_position = kv_bytes_per_position(model.cfg, model.embed.W_E.dtype)
    n = len(stream)
    outputs, first, finish, times = [None] * n, [None] * n, [None] * n, [None] * n
    peak, held_sum, room_sum = 0, 0, 0
    counter = PositionCounter(model.embed)
    pending = deque(range(n))
    t0, clock = time.perf_counter(), CpuClock()
    try:
        while pending:
            sleep_until(t0, stream[pending[0]].arrival)
            now = time.perf_counter() - t0
            batch = []
            while pending and len(batch) < max_batch and stream[pending[0]].arrival <= now:
                batch.append(pending.popleft())
            width = max(len(stream[i].prompt) for i in batch)
            budgets = RowBudgets([stream[i].new_tokens for i in batch], width, t0)
            texts = [tokenizer.decode(stream[i].prompt) for i in batch]
            ids = generate(model, tokenizer, texts, max(stream[i].new_tokens for i in batch), temperature=0.0,
                           stopping_criteria=[budgets])
            steps = ids.shape[1] - width
            # The cache holds every row at the batch's full width until the batch ends.
            peak = max(peak, len(batch) * (width + steps))
            room_sum += len(batch) * (width + steps)
            for row, i in enumerate(batch):
                outputs[i] = ids[row, width: width + stream[i].new_tokens].tolist()
                times[i] = budgets.times[: stream[i].new_tokens]  # a row's token k is ready at the batch's step k
                first[i], finish[i] = times[i][0], times[i][-1]
                held_sum += len(stream[i].prompt) + stream[i].new_tokens
        cpu = clock.seconds()
    finally:
        counter.remove()
    return Served("static", outputs, first, finish, times, counter.positions, counter.prefill_positions,
                  peak * per_position, held_sum / room_sum, cpu_seconds=cpu)


@contextmanager
def frozen_gc():
    """Stopping Hugging Face's manager runs ``gc.collect`` twice, which takes seconds with transformers and torch
    loaded. Inside this block the collector skips every object that existed when it began (``gc.freeze``);
    ``gc.unfreeze`` afterwards hands them back to it as they were."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def hf_manager(hf_model, n_blocks: int, block_size: int, max_running: int, max_batch_tokens: int):
    """Hugging Face's continuous-batching manager with the course engine's cache shape: greedy, no EOS."""
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=1)
    cb_config = ContinuousBatchingConfig(page_size=block_size, num_blocks=n_blocks, max_requests_per_batch=max_running,
                                         max_batch_tokens=max_batch_tokens)
    return hf_model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)


def run_hf(hf_model, stream: list[StreamRequest], n_blocks: int, block_size: int, max_running: int,
           max_batch_tokens: int) -> Served:
    """Hugging Face's continuous batching: its loop runs in its own thread; this one adds each request at its
    arrival (``add_request``) and collects the results, with a timestamp per token."""
    manager = hf_manager(hf_model, n_blocks, block_size, max_running, max_batch_tokens)
    peak_used = [0.0]

    def during_forward():
        cache = getattr(manager.batch_processor, "cache", None)
        if cache is not None:
            total = cache.num_sectors * cache.bytes_per_sector
            peak_used[0] = max(peak_used[0], total - cache.compute_free_capacity(relative=False))

    counter = PositionCounter(hf_model.transformer.h[0].ln_1, during_forward)
    n = len(stream)
    results: dict[str, object] = {}
    clock = CpuClock()
    manager.start()
    try:
        t0 = time.perf_counter()
        clock.threads_started_since()  # the manager's loop thread
        for i, request in enumerate(stream):
            sleep_until(t0, request.arrival)
            manager.add_request(request.prompt, request_id=f"r{i}", max_new_tokens=request.new_tokens,
                                record_timestamps=True, eos_token_id=-1)
        while len(results) < n:
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("Hugging Face's continuous-batching loop stopped before every request finished")
                continue
            if result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"Hugging Face's continuous batching failed request {result.request_id}: "
                                       f"{result.error}")
                results[result.request_id] = result
        cpu = clock.seconds()  # this thread mostly waits on a queue; the time is the loop thread's
    finally:
        with frozen_gc():
            manager.stop(block=True, timeout=10)
            manager.destroy()
        counter.remove()
    ordered = [results[f"r{i}"] for i in range(n)]
    outputs = [list(result.generated_tokens) for result in ordered]
    decoded = sum(len(out) - 1 for out in outputs)
    times = [[t - t0 for t in result.timestamps] for result in ordered]
    return Served("hf", outputs, [t[0] for t in times], [t[-1] for t in times], times, counter.positions,
                  counter.positions - decoded, peak_used[0] or None, None, cpu_seconds=cpu)


@dataclass
class Summary:
    """The figures the bench reports for one run of one engine."""

    tokens_per_s: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    makespan: float
    gap_p99: float | None  # over every gap between two consecutive tokens of a request (None: times not recorded)
    served: Served = field(repr=False)
    tokens_per_cpu_s: float | None = None  # new tokens / the process's CPU seconds (None: not measured)


def quantile(values: list[float], q: float) -> float:
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), q))


def token_gaps(token_times: list[list[float]]) -> list[float]:
    """Every wait between two consecutive tokens of one request, all requests together (not a mean per request:
    a request that stalls once among many quick tokens keeps that one long wait)."""
    return [later - earlier for times in token_times for earlier, later in zip(times, times[1:])]


def summarise(served: Served, stream: list[StreamRequest]) -> Summary:
    """Throughput over the whole run (last token ready), time to first token from arrival, time per later token
    (p50 and p99 over the requests), and the p99 over every gap between consecutive tokens."""
    makespan = max(served.finish)
    ttft = [first - request.arrival for first, request in zip(served.first, stream)]
    tpot = [(end - first) / (request.new_tokens - 1)
            for first, end, request in zip(served.first, served.finish, stream) if request.new_tokens > 1]
    tpot = tpot or [0.0]
    tokens = sum(len(out) for out in served.outputs)
    gaps = None if served.token_times is None else token_gaps(served.token_times) or [0.0]
    per_cpu = None if not served.cpu_seconds else tokens / served.cpu_seconds
    return Summary(tokens / makespan, quantile(ttft, 0.5), quantile(ttft, 0.99), quantile(tpot, 0.5),
                   quantile(tpot, 0.99), makespan, None if gaps is None else quantile(gaps, 0.99), served, per_cpu)
