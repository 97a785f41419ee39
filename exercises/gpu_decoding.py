# GENERATED from solutions/gpu_decoding.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 3c7c11dca3a02452d7d1149dd224f4aaf0415c2afe6956b5f5e1e1a3e80ea741
"""Part 6b: fast decoding on a GPU.

Part 6 worked out a floor for a decode step: every weight is read once per step, so a step
cannot take less than the weights' bytes over the memory bandwidth (on the CPU, the story
model's step was dominated instead by the fixed cost of each operation: its weights fit in the CPU's
caches). A GPU reads GPT-2 small's weights many times faster, and then another cost shows:
the host (Python, and torch's dispatch under it) must *launch* every kernel of the step, a
few hundred of them, each taking the host some microseconds; and whenever Python reads a value
back from the GPU (``if finished.all()``, ``int(token)``, ``.item()``), the host waits until
the GPU has finished everything queued, and the GPU then waits for the host to launch the
next kernels. For a small model both can cost more than the arithmetic (notebook 06b
measures it). Three changes remove them, one exercise each:

* ``fixed_shape_step``: a decode step in which every shape, every memory address and every
  operation is the same at every position: the position lives in a tensor on the device, the
  new keys and values are written into the static cache at that position, and attention reads
  every slot through a mask. It is the model's one forward pass on a cache of the protocol of
  its own, ``FixedShapeCache`` (yours). Such a step can be *captured*: recorded once as a CUDA
  graph and then replayed with a single launch (``CapturedDecoder``, written for you, does that).
* ``race_sample``: draw the next token without a host synchronisation (the exponential race).
* ``decode_loop``: look at which rows have finished every few steps instead of after every one.

``CapturedDecoder.generate`` puts the three together. On a CPU (or an Apple GPU) nothing is
captured: the same step runs eagerly, so the code, and your exercises, run and are checked
everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.devices import check_generator, check_same_device, model_device

from .caches import StaticKeyValueCache
from .kv_cache import CacheStep
from .transformer import DemoTransformer

# ---------------------------------------------------------------------------------------
# A decode step with fixed shapes
# ---------------------------------------------------------------------------------------


class FixedShapeCache:
    """A static cache's buffer, written at a position held on the device: one new token per row.

    ``buffer`` is ``(n_layers, 2, batch, max_len, n_heads, d_head)``: slots ``0 .. position - 1``
    of every layer hold the keys and values of the tokens before; ``position`` is a 0-d integer
    tensor on the model's device, the new tokens' position (the same for every row). Each
    layer's ``update`` writes the new keys and values into slot ``position``, in place, and
    returns every one of the ``max_len`` slots; the step's mask shows the new token slots
    ``0 .. position`` only. Nothing depends on the value of ``position`` on the host.
    """

    def __init__(self, buffer: Float[Tensor, "n_layers 2 batch max_len n_heads d_head"], position: Int[Tensor, ""]):
        self.buffer, self.position = buffer, position
        # A 1-element index: a 0-d tensor used as an index is read back to the host as an int.
        self.slot = position.view(1)

    def prepare(self, tokens: Int[Tensor, "batch 1"], attention_mask: None = None) -> CacheStep:
        """Every token given is new, at ``position``; each sees the slots up to its own."""
        max_len = self.buffer.shape[3]
        # Hint: positions and mask as device tensors built from position; no int(position), no slicing up to it.
        raise NotImplementedError()

    def update(
        self, layer: int, k: Float[Tensor, "batch 1 n_heads d_head"], v: Float[Tensor, "batch 1 n_heads d_head"]
    ) -> tuple[Float[Tensor, "batch max_len n_heads d_head"], Float[Tensor, "batch max_len n_heads d_head"]]:
        """Write the new keys and values into slot ``position``; return every slot (the mask decides)."""
        # Hint: index_copy_ along the position dimension at self.slot writes in place at a device index.
        raise NotImplementedError()

    def commit(self) -> "FixedShapeCache":
        return self  # the position moves on the device, in the decoder's step


def fixed_shape_step(
    model: DemoTransformer,
    buffer: Float[Tensor, "n_layers 2 batch max_len n_heads d_head"],
    tokens: Int[Tensor, "batch"],
    position: Int[Tensor, ""],
) -> Float[Tensor, "batch d_vocab"]:
    """The next-token logits after one new token per row, at ``position``, every earlier one cached.

    The model's own forward pass on a ``FixedShapeCache``: the shapes of every tensor and the
    operations run are the same at every position, and no value is read back from the device.
    That is what capturing the step as a CUDA graph needs. Slots past ``position`` must hold
    finite numbers (``CapturedDecoder`` zeroes its buffer): a masked slot gets attention
    weight 0, but 0 times NaN is NaN.
    """
    logits, _ = model(tokens[:, None], FixedShapeCache(buffer, position))
    return logits[:, 0]


# ---------------------------------------------------------------------------------------
# Sampling without a host synchronisation
# ---------------------------------------------------------------------------------------


def race_sample(logits: Float[Tensor, "batch d_vocab"], generator: torch.Generator | None = None) -> Int[Tensor, "batch"]:
    """One token per row, drawn from softmax(logits) (the law of ``torch.multinomial``), with no host sync.

    The exponential race: give every token an independent alarm clock that rings after an
    exponential time of rate p_i (its probability); the first clock to ring names the token.
    Clock i rings at E_i / p_i with E_i ~ Exp(1), so the token is argmax_i p_i / E_i, and it
    is token i with probability exactly p_i. It is a few element-wise kernels and an argmax on
    the device, with no value read back to the host, in any version of PyTorch. Write it
    without ``torch.multinomial``: ``torch.multinomial(probs, 1)`` draws by this same race,
    but PyTorch has for years checked its input first with values read back to the host
    (``aten/src/ATen/native/Distributions.cpp``), which makes the host wait for the device.

    Tokens with probability 0 (logit -inf) never win. The clocks come from ``generator``
    (torch's global generator when None), one per token and row, so rows are independent.
    """
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor of shape (batch, d_vocab), got {getattr(logits, 'shape', logits)!r}")
    check_generator(generator, logits.device)
    # Hint: torch.empty_like(probs).exponential_(generator=generator) gives one Exp(1) clock per token and row.
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# Looking at finished rows every few steps
# ---------------------------------------------------------------------------------------


def decode_loop(
    step: Callable[[], Int[Tensor, "batch"]],
    finished: Bool[Tensor, "batch"],
    max_new_tokens: int,
    check_every: int = 8,
) -> Int[Tensor, "batch new"]:
    """Call ``step()`` up to ``max_new_tokens`` times; return its tokens, one column per step.

    ``step()`` returns each row's new token (a pad for rows already finished) in the same
    tensor every time, which its next call overwrites, and marks rows that finish in
    ``finished`` (on the device, updated in place). Reading ``finished`` on the host makes the
    host wait for the device, so the loop looks only after every ``check_every``-th step, and
    stops at the first look that finds every row finished (or after ``max_new_tokens`` steps).

    The result is what a loop that looked after every step would return: the columns after
    the step at which the last row finished (pads only) are left out.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every must be an integer >= 1 (1 looks after every step), got {check_every!r}")
    if max_new_tokens == 0:
        return torch.empty(finished.shape[0], 0, dtype=torch.long, device=finished.device)
    # Hint: keep a copy of each step's tokens and finished.all() as a device tensor; only bool() it every check_every steps.
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# The captured decoder (written for you)
# ---------------------------------------------------------------------------------------


class CapturedDecoder:
    """Greedy or sampled decoding of a batch of prompts of one length, one captured step per token.

    ``prefill`` runs the prompts through part 6's ``StaticKeyValueCache`` (its fast path:
    shapes that change with the prompt, run once, eagerly) and chooses each row's first new
    token. Every later token comes from ``step``: ``fixed_shape_step``, then the choice
    (argmax at temperature 0, else ``race_sample`` of the logits over the temperature), a pad
    for rows already finished, the update of ``finished``, and ``position + 1``, all on the
    device and on tensors allocated once. On a CUDA GPU (``capture``, the default there) the
    step is recorded once as a CUDA graph and replayed; elsewhere it runs eagerly, the same code.

    Sampling draws from torch's global generator (``torch.manual_seed`` seeds it): a CUDA
    graph replays torch's default generator correctly, a generator of your own it does not.
    """

    def __init__(
        self,
        model: DemoTransformer,
        batch: int,
        max_len: int,
        *,
        temperature: float = 0.0,
        eos_token_id: int | None = None,
        pad_token_id: int = 0,
        capture: bool | None = None,
    ):
        cfg = model.cfg
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not 2 <= max_len <= cfg.n_ctx:
            raise ValueError(f"max_len must be an integer in [2, n_ctx={cfg.n_ctx}], got {max_len!r}")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
        self.model, self.temperature = model, float(temperature)
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.device = device = model_device(model)
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError(f"capture=True needs the model on a CUDA GPU (CUDA graphs); it is on {device}")
        dtype = model.embed.W_E.dtype
        # Zeros, not torch.empty: the step's attention reads every slot (masked slots weigh 0, and 0 * NaN is NaN).
        self.cache = StaticKeyValueCache(
            torch.zeros(cfg.n_layers, 2, batch, max_len, cfg.n_heads, cfg.d_head, device=device, dtype=dtype)
        )
        # The static tensors: a captured graph reads and writes exactly these addresses at every replay.
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def choose(self, logits: Float[Tensor, "batch d_vocab"]) -> Int[Tensor, "batch"]:
        """Each row's next token: argmax at temperature 0, else a draw from softmax(logits / temperature)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        return race_sample(logits / self.temperature)

    def _finish(self, chosen: Int[Tensor, "batch"]) -> Int[Tensor, "batch"]:
        """Pads for the rows already finished; mark the rows whose token is the end token."""
        chosen = torch.where(self.finished, self.pad_token_id, chosen)
        if self.eos_token_id is not None:
            self.finished |= chosen == self.eos_token_id
        return chosen

    @torch.inference_mode()
    def prefill(self, prompts: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch"]:
        """Run the prompts (one row each, all of one length) into the cache; each row's first new token."""
        if prompts.ndim != 2 or prompts.shape[0] != self.batch:
            raise ValueError(f"prompts must have shape (batch={self.batch}, pos), got {tuple(prompts.shape)}")
        if not 1 <= prompts.shape[1] < self.max_len:
            raise ValueError(f"the prompts have {prompts.shape[1]} tokens; the cache holds max_len={self.max_len}, "
                             "which must leave room for at least one new token")
        check_same_device("the prompts", prompts.device, self.device)
        self.cache.seq_len, self.cache.batch = 0, self.batch
        self.cache.buffer.zero_()
        self.finished.zero_()
        logits, _ = self.model(prompts, self.cache)
        chosen = self._finish(self.choose(logits[:, -1]))
        self.tokens.copy_(chosen)
        self.position.fill_(prompts.shape[1])
        return chosen

    def _step(self) -> Int[Tensor, "batch"]:
        """One decode step on the static tensors only (what is captured)."""
        logits = fixed_shape_step(self.model, self.cache.buffer, self.tokens, self.position)
        self.tokens.copy_(self._finish(self.choose(logits)))
        self.position.add_(1)
        return self.tokens

    @torch.inference_mode()
    def step(self) -> Int[Tensor, "batch"]:
        """The next token of every row (in ``self.tokens``, overwritten by the next step)."""
        if not self.capture:
            return self._step()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.tokens

    def _capture(self) -> None:
        """Record one step as a CUDA graph: warm up on a side stream first (cuBLAS and attention pick
        their kernels on first use), then capture. Recording runs nothing, and the warm-up's changes
        to the static tensors and to torch's generator are undone: the next replay is the next step, and
        a seeded run draws the same tokens whether or not its first step captured the graph."""
        saved = [t.clone() for t in (self.tokens, self.position, self.finished)]
        rng = torch.cuda.get_rng_state(self.device)  # the warm-up's draws must not move the sampled stream
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
                for t, s in zip((self.tokens, self.position, self.finished), saved):
                    t.copy_(s)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.set_rng_state(rng, self.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()

    @torch.inference_mode()
    def generate(self, prompts: Int[Tensor, "batch pos"], max_new_tokens: int, check_every: int = 8) -> Int[Tensor, "batch seq"]:
        """The prompts followed by up to ``max_new_tokens`` new tokens per row; rows stop at the end
        token and are padded after it, and the batch stops when every row has, as part 5's ``generate``."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if prompts.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(f"the prompts ({prompts.shape[1]} tokens) plus max_new_tokens={max_new_tokens} do not fit "
                             f"the cache's max_len={self.max_len}")
        first = self.prefill(prompts)
        columns = [prompts, first[:, None]]
        if self.eos_token_id is None or not bool(self.finished.all()):
            columns.append(decode_loop(self.step, self.finished, max_new_tokens - 1, check_every))
        return torch.cat(columns, dim=1)
