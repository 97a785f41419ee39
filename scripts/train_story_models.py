"""Train the two story models that ship with the course, "story" and "story-draft".

Both are Hugging Face ``GPT2LMHeadModel``s trained from scratch on stories sampled from
the grammar in ``sampling_course/stories.py``, with the story tokenizer. Because the
grammar's probabilities are known exactly, the script reports each model's held-out loss
next to the entropy floor, the loss no model can beat::

    python scripts/train_story_models.py                  # both models (20-25 minutes on 2 idle CPU cores)
    python scripts/train_story_models.py --model story-draft
    python scripts/train_story_models.py --smoke --out /tmp/smoke   # a few seconds

The results are saved with ``save_pretrained`` (float16 weights, the tokenizer and
``training.json`` with the run's figures) under ``sampling_course/assets/<name>/``.

Training windows. GPT-2 learns one embedding per position, so *where* a token sits in the
window matters. If windows were cut from one long stream at random offsets, position 0
would almost always be the middle of a story, and the model would learn that early
positions are mid-story; a story read from its beginning (as every evaluation and every
generation does) would then look unusual. So every window here starts with
``<|endoftext|>`` and the first token of a story; whole stories, each after its own
``<|endoftext|>``, fill the rest, and the last one is cut off where the window ends.

Budget. Each model trains for a fixed number of tokens (see ``RECIPES``), chosen from
throughput measured on a 2-core machine (float32, eager PyTorch, about 4,500 tokens/s
for the 4-layer model) so that both together take roughly 20-25 minutes there when
nothing else runs. On a busy machine ``--threads 1`` can
be much faster than the default. Training is seeded: a rerun gives the same model up to
floating-point differences between machines and thread counts.

The held-out loss is measured on ~20,000 tokens of stories drawn with a seed training
never uses, each read from position 0; stories too long for the context are left out of
both the loss and the floor (see ``sampling_course.stories.heldout_stories``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

# Let the script run from a plain checkout, without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sampling_course.stories import Story, entropy_floor, heldout_stories, sample_stories  # noqa: E402
from sampling_course.tokenizer import ASSETS_DIR, load_story_tokenizer  # noqa: E402

TRAIN_SEED = 1000  # stories for training come from seeds TRAIN_SEED, TRAIN_SEED + 1, ...


@dataclass(frozen=True)
class Recipe:
    """Architecture and training budget of one model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_ctx: int
    tokens: int  # training tokens in all
    lr: float  # peak learning rate
    batch: int = 8  # windows per step, each n_ctx tokens
    warmup: float = 0.05  # fraction of the steps spent warming up
    seed: int = 0
    weight_decay: float = 0.1  # AdamW's, on the weight matrices only


RECIPES = {
    # 4 layers: enough to copy names and toys from the opening to the end. A second,
    # shorter stage with a lower peak learning rate (a warm restart) takes it the last
    # few hundredths of a nat towards the floor.
    "story": [
        Recipe(n_layer=4, n_embd=192, n_head=6, n_ctx=512, tokens=4_300_000, lr=2e-3),
        Recipe(n_layer=4, n_embd=192, n_head=6, n_ctx=512, tokens=1_000_000, lr=6e-4, seed=1),
    ],
    # 1 layer: fast, for speculative decoding; it cannot copy as well, so its loss is higher.
    "story-draft": [Recipe(n_layer=1, n_embd=128, n_head=4, n_ctx=512, tokens=2_000_000, lr=3e-3)],
}
SMOKE = Recipe(n_layer=1, n_embd=32, n_head=2, n_ctx=128, tokens=40 * 4 * 128, lr=1e-2, batch=4, warmup=0.1)


# ---------------------------------------------------------------------------------------
# Held-out loss of a model against the floor
# ---------------------------------------------------------------------------------------


def story_loss(hf_model, tokenizer, stories: Sequence[Story], batch_size: int = 16,
               prefix: Sequence[int] = ()) -> float:
    """A causal LM's mean loss in nats per token on ``stories``, each read from position 0.

    Each story is read as ``<|endoftext|>`` + story, and the model is scored on every
    story token and the closing ``<|endoftext|>``: the tokens :func:`entropy_floor` counts.
    ``prefix`` (a model trained with a sink token: that token) goes before the ``<|endoftext|>``,
    unscored.
    """
    eos = tokenizer.eos_token_id
    skip = len(prefix) + 1  # targets 1 .. len(prefix) are the prefix and the <|endoftext|>: not the story's
    rows = sorted((list(prefix) + [eos] + tokenizer(s.text).input_ids + [eos] for s in stories), key=len)
    device = next(hf_model.parameters()).device
    nats = 0.0
    count = 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = len(batch[-1])
            # Right padding needs no attention mask in a causal model: real tokens never
            # look at the padding after them, and padded targets are masked out below.
            ids = torch.tensor([r + [eos] * (width - len(r)) for r in batch], device=device)
            mask = torch.tensor([[0] * skip + [1] * (len(r) - skip) + [0] * (width - len(r)) for r in batch],
                                device=device)
            logits = hf_model(ids).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            keep = mask[:, 1:].bool()
            nats -= logp[keep].sum().item()
            count += int(keep.sum())
    return nats / count


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


def windows(tokenizer, n_ctx: int, seed: int, prefix: Sequence[int] = ()):
    """Endless training windows of ``n_ctx`` tokens, each starting with ``prefix`` (none by default),
    then EOS + a story."""
    eos = tokenizer.eos_token_id
    n_ctx -= len(prefix)
    backend = tokenizer.backend_tokenizer  # batch encoding without per-call overhead
    chunk = 0
    window: list[int] = []
    while True:
        stories = sample_stories(256, seed + chunk)
        chunk += 1
        for encoding in backend.encode_batch([s.text for s in stories]):
            window += [eos] + encoding.ids
            if len(window) >= n_ctx:
                yield list(prefix) + window[:n_ctx]
                window = []  # the next window starts with a new story


def batches(tokenizer, recipe: Recipe, seed: int, prefix: Sequence[int] = ()):
    stream = windows(tokenizer, recipe.n_ctx, seed, prefix)
    while True:
        yield torch.tensor([next(stream) for _ in range(recipe.batch)])


def lr_at(step: int, steps: int, recipe: Recipe) -> float:
    """Linear warmup, then a cosine decay to a tenth of the peak."""
    warmup = max(1, int(recipe.warmup * steps))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build_model(recipe: Recipe, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=recipe.n_ctx,
        n_embd=recipe.n_embd,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        # The source is unlimited, so there is nothing to overfit: no dropout.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(recipe.seed)
    return GPT2LMHeadModel(config)


def train_stage(name: str, model, recipe: Recipe, tokenizer, heldout, floor: float,
                eval_every: int = 200, log_every: int = 25, prefix: Sequence[int] = (),
                on_eval: Callable | None = None) -> dict:
    """One stage of training: AdamW, linear warmup then cosine decay; returns its figures.

    ``prefix`` starts every training window and every held-out story (see :func:`windows`);
    ``on_eval(model)``, when given, runs after each held-out measurement (the model in eval mode)."""
    steps = max(1, recipe.tokens // (recipe.batch * recipe.n_ctx))
    print(f"[{name}] stage: {steps} steps of {recipe.batch} x {recipe.n_ctx} tokens, peak lr {recipe.lr}",
          flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr, betas=(0.9, 0.95),
    )
    data = batches(tokenizer, recipe, TRAIN_SEED + 1_000_000 * recipe.seed, prefix)
    losses: list[float] = []
    curve: list[tuple[int, float]] = []
    train_time = 0.0
    model.train()
    for step in range(steps):
        ids = next(data)
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, recipe)
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        train_time += time.perf_counter() - start
        losses.append(loss.item())
        done = (step + 1) * recipe.batch * recipe.n_ctx
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"[{name}] step {step + 1}/{steps} train loss {recent:.4f} "
                  f"{done / train_time:,.0f} tokens/s", flush=True)
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            model.eval()
            held = story_loss(model, tokenizer, heldout, prefix=prefix)
            if on_eval is not None:
                on_eval(model)
            model.train()
            curve.append((step + 1, held))
            print(f"[{name}] step {step + 1}: held-out {held:.4f} (floor {floor:.4f}, gap {held - floor:+.4f})",
                  flush=True)
    model.eval()
    held = story_loss(model, tokenizer, heldout, prefix=prefix)
    if on_eval is not None:
        on_eval(model)
    curve.append((steps, held))
    tokens = steps * recipe.batch * recipe.n_ctx
    print(f"[{name}] stage done: held-out {held:.4f}, floor {floor:.4f}, gap {held - floor:.4f}; "
          f"{tokens:,} tokens in {train_time / 60:.1f} min ({tokens / train_time:,.0f} tokens/s)", flush=True)
    return {
        "recipe": asdict(recipe),
        "steps": steps,
        "tokens": tokens,
        "train_seconds": round(train_time, 1),
        "tokens_per_second": round(tokens / train_time),
        "torch_threads": torch.get_num_threads(),
        "heldout_curve": [(s, round(v, 4)) for s, v in curve],
        "first_train_loss": losses[0],
        "last_train_loss": sum(losses[-10:]) / len(losses[-10:]),
    }


def train(name: str, stages: list[Recipe], out_dir: Path | None, heldout_tokens: int = 20_000,
          log_every: int = 25, resume: Path | None = None) -> dict:
    """Train one model through its stages, save it to ``out_dir / name``; return the figures.

    A later stage continues from the weights of the one before (a warm restart: its own
    warmup and decay). With ``resume``, the stages continue the model saved there.
    """
    tokenizer = load_story_tokenizer()
    done: list[dict] = []
    if resume is None:
        model = build_model(stages[0], tokenizer)
    else:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(resume, dtype=torch.float32)
        done = json.loads((Path(resume) / "training.json").read_text())["stages"]
    recipe = stages[0]
    n_params = sum(p.numel() for p in model.parameters())
    heldout = heldout_stories(tokenizer, recipe.n_ctx, heldout_tokens)
    floor = entropy_floor(heldout, tokenizer)
    print(f"[{name}] {recipe.n_layer} layers x d_model {recipe.n_embd}, n_ctx {recipe.n_ctx}: "
          f"{n_params / 1e6:.2f}M parameters; floor {floor:.4f} nats/token on {len(heldout)} held-out stories",
          flush=True)
    for i, stage in enumerate(stages):
        if done:
            # Stages meet through float16 weights, exactly as when one is saved and the next resumed.
            model.half().float()
        done.append(train_stage(name, model, stage, tokenizer, heldout, floor, log_every=log_every))

    held = done[-1]["heldout_curve"][-1][1]
    tokens = sum(stage["tokens"] for stage in done)
    seconds = sum(stage["train_seconds"] for stage in done)
    figures = {
        "name": name,
        "parameters": n_params,
        "tokens": tokens,
        "train_seconds": round(seconds, 1),
        "heldout_stories": len(heldout),
        "heldout_loss": held,
        "entropy_floor": round(floor, 4),
        "gap": round(held - floor, 4),
        "stages": done,
    }
    print(f"[{name}] held-out loss {held:.4f} nats/token, entropy floor {floor:.4f}, gap {held - floor:.4f}; "
          f"{tokens:,} tokens in {seconds / 60:.1f} min of training", flush=True)
    if out_dir is not None:
        save_trained(model, tokenizer, figures, Path(out_dir), name)
    return figures


def save_trained(model, tokenizer, figures: dict, out_dir: Path, name: str) -> None:
    """``out_dir/name``: the model in float16 (half the files; the course loads it back as float32),
    its tokenizer and ``training.json``; the asset manifest rewritten when that is the course's assets."""
    target = out_dir / name
    model.to(torch.float16).save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "training.json").write_text(json.dumps(figures, indent=2) + "\n")
    if out_dir.resolve() == ASSETS_DIR.resolve():
        from sampling_course.files import write_asset_manifest

        write_asset_manifest()  # the shipped files' sizes and checksums, which loading checks
    print(f"[{name}] saved to {target}", flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*RECIPES, "both"], default="both")
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="where the model directories go")
    parser.add_argument("--tokens", type=int, help="override the training budget (tokens per model)")
    parser.add_argument("--lr", type=float, help="override the peak learning rate")
    parser.add_argument("--smoke", action="store_true", help="a few steps of a tiny model, for tests")
    parser.add_argument("--seed", type=int, help="override the seed (initialisation and training stories)")
    parser.add_argument("--resume", type=Path, help="continue training the model saved in this directory")
    parser.add_argument("--threads", type=int,
                        help="torch threads (default: all cores; on a machine busy with other work, 1 can be faster)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.smoke:
        recipe = SMOKE
        if args.tokens:
            recipe = replace(recipe, tokens=args.tokens)
        # A model this small runs fastest on one thread (and leaves the others alone).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [train("smoke", [recipe], args.out, heldout_tokens=1_000, log_every=10)]
        finally:
            torch.set_num_threads(threads)
    names = list(RECIPES) if args.model == "both" else [args.model]
    results = []
    for name in names:
        stages = RECIPES[name]
        if args.resume:
            stages = stages[-1:]  # one more stage, with the overrides below
        overrides = {"tokens": args.tokens, "lr": args.lr, "seed": args.seed}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides and len(stages) > 1:
            parser.error("--tokens, --lr and --seed apply to one stage: use them with --resume or the draft")
        stages = [replace(stage, **overrides) for stage in stages]
        results.append(train(name, stages, args.out, resume=args.resume))
    return results


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
