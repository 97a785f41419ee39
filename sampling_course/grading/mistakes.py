"""Plant the classic mistakes of each exercise and check that the tests catch every one.

A grading test is only worth something if it fails on wrong code. Each ``Mistake`` below
rewrites one line of the solutions the way a learner might get it wrong (temperature
multiplied instead of divided, an exclusive top-p cutoff, a mask off by one, ...). The
runner copies ``solutions/`` into a scratch package named ``exercises``, plants one
mistake, runs that part's test file with ``--impl exercises`` and expects it to fail.

    sampling-course plant-mistakes            # all of them (a few minutes)
    sampling-course plant-mistakes --part 2   # one part
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mistake:
    part: int
    name: str
    file: str  # a file in solutions/
    old: str  # text that must occur exactly once in that file
    new: str
    tests: str  # the test file expected to catch it


# ---------------------------------------------------------------------------------------
# Part 1: GPT-2 from scratch
# ---------------------------------------------------------------------------------------
PART1 = [
    Mistake(1, "LayerNorm with unbiased variance", "transformer.py",
            "residual.pow(2).mean(dim=-1, keepdim=True)",
            "residual.var(dim=-1, keepdim=True, unbiased=True)", "test_transformer.py"),
    Mistake(1, "LayerNorm eps outside the sqrt", "transformer.py",
            "(residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
            "residual.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps", "test_transformer.py"),
    Mistake(1, "LayerNorm without w", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale + self.b", "test_transformer.py"),
    Mistake(1, "LayerNorm without b", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale * self.w", "test_transformer.py"),
    Mistake(1, "attention scaled by d_model", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_model)', "test_transformer.py"),
    Mistake(1, "attention not scaled", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k")', "test_transformer.py"),
    Mistake(1, "causal mask hides the diagonal", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos,", "test_transformer.py"),
    Mistake(1, "causal mask lets one future token through", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos + 2,", "test_transformer.py"),
    Mistake(1, "MLP with relu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.relu(pre),", "test_transformer.py"),
    Mistake(1, "MLP with erf gelu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.nn.functional.gelu(pre),", "test_transformer.py"),
    Mistake(1, "positions not added", "transformer.py",
            "residual = self.embed(tokens) + self.pos_embed(tokens)\n", "residual = self.embed(tokens)\n",
            "test_transformer.py"),
    Mistake(1, "missing b_Q", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_Q', '"b s n d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_V", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_V', '"b s n d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_O", "transformer.py",
            '"b q n h, n h d -> b q d") + self.b_O', '"b q n h, n h d -> b q d")', "test_transformer.py"),
    Mistake(1, "missing b_in", "transformer.py",
            '"b s d, d m -> b s m") + self.b_in', '"b s d, d m -> b s m")', "test_transformer.py"),
    Mistake(1, "missing b_out", "transformer.py",
            '"b s m, m d -> b s d") + self.b_out', '"b s m, m d -> b s d")', "test_transformer.py"),
    Mistake(1, "missing b_U", "transformer.py",
            '"b s d, d v -> b s v") + self.b_U', '"b s d, d v -> b s v")', "test_transformer.py"),
]

# ---------------------------------------------------------------------------------------
# Part 2: sampling
# ---------------------------------------------------------------------------------------
PART2 = [
    Mistake(2, "greedy argmax over the wrong dimension", "sampling.py",
            "return logits.argmax(dim=-1)", "return logits.argmax(dim=0)", "test_sampling.py"),
    Mistake(2, "temperature multiplied instead of divided", "sampling.py",
            "return logits / temperature", "return logits * temperature", "test_sampling.py"),
    Mistake(2, "presence penalty (once per distinct token) instead of frequency penalty", "sampling.py",
            "counts = torch.bincount(input_ids, minlength=logits.shape[-1])",
            "counts = (torch.bincount(input_ids, minlength=logits.shape[-1]) > 0).long()", "test_sampling.py"),
    Mistake(2, "frequency penalty added instead of subtracted", "sampling.py",
            "return logits - freq_penalty * counts.to(logits.dtype)",
            "return logits + freq_penalty * counts.to(logits.dtype)", "test_sampling.py"),
    Mistake(2, "sample_basic returns the argmax", "sampling.py",
            "draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), num_samples=1)",
            "draws = probs.reshape(-1, probs.shape[-1]).argmax(dim=-1, keepdim=True)", "test_sampling.py"),
    Mistake(2, "sample_basic softmax over the batch dimension", "sampling.py",
            "probs = logits.softmax(dim=-1)\n        # multinomial",
            "probs = logits.softmax(dim=0)\n        # multinomial", "test_sampling.py"),
    Mistake(2, "top-k from k-1 tokens", "sampling.py",
            "top_logits, top_tokens = logits.topk(k, dim=-1)",
            "top_logits, top_tokens = logits.topk(max(k - 1, 1), dim=-1)", "test_sampling.py"),
    Mistake(2, "top-k uniform over the top k", "sampling.py",
            "choice = TransformerSampler.sample_basic(top_logits)",
            "choice = TransformerSampler.sample_basic(torch.zeros_like(top_logits))", "test_sampling.py"),
    Mistake(2, "top-k returns the rank instead of the token", "sampling.py",
            "return top_tokens.gather(-1, choice[..., None])[..., 0]", "return choice", "test_sampling.py"),
    Mistake(2, "top-p cutoff exclusive instead of inclusive", "sampling.py",
            "keep = mass_above < top_p", "keep = sorted_probs.cumsum(dim=-1) < top_p", "test_sampling.py"),
    Mistake(2, "top-p ignores min_tokens_to_keep", "sampling.py",
            "keep[..., :min_tokens_to_keep] = True", "keep[..., :1] = True", "test_sampling.py"),
    Mistake(2, "top-p sorts ascending", "sampling.py",
            "sorted_logits, sorted_tokens = logits.sort(dim=-1, descending=True)",
            "sorted_logits, sorted_tokens = logits.sort(dim=-1, descending=False)", "test_sampling.py"),
    Mistake(2, "top-p returns the rank instead of the token", "sampling.py",
            "return sorted_tokens.gather(-1, choice[..., None])[..., 0]", "return choice", "test_sampling.py"),
    Mistake(2, "frequency penalty applied before the temperature", "sampling.py",
            "        logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n",
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "        logits = TransformerSampler.apply_temperature(logits, temperature)\n", "test_sampling.py"),
    Mistake(2, "sample_next_token ignores top_k", "sampling.py",
            "if top_k > 0:\n", "if False:\n", "test_sampling.py"),
    Mistake(2, "sample_next_token ignores top_p", "sampling.py",
            "if top_p > 0.0:\n", "if False:\n", "test_sampling.py"),
    Mistake(2, "sample passes only the temperature on", "sampling.py",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n",
            "next_token = self.sample_next_token(input_ids, logits, kwargs.get(\"temperature\", 1.0))\n",
            "test_sampling.py"),
    Mistake(2, "sample loop ignores EOS", "sampling.py",
            "if next_token == self.tokenizer.eos_token_id:", "if False:", "test_sampling.py"),
    Mistake(2, "sample loop stops before EOS and drops it", "sampling.py",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
            "            if next_token == self.tokenizer.eos_token_id:\n"
            "                break\n", "test_sampling.py"),
    Mistake(2, "sample loop generates one token too many", "sampling.py",
            "for _ in range(max_tokens_generated):", "for _ in range(max_tokens_generated + 1):", "test_sampling.py"),
    Mistake(2, "sample feeds the whole sequence past n_ctx", "sampling.py",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]",
            "logits = self.model(input_ids[None])[0, -1]", "test_sampling.py"),
    Mistake(2, "sample context window off by one", "sampling.py",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx + 1 :])[0, -1]", "test_sampling.py"),
]

# ---------------------------------------------------------------------------------------
# Part 3: beam search
# ---------------------------------------------------------------------------------------
PART3 = [
    Mistake(3, "beams ranked by logits instead of log-probs", "beams.py",
            "logprobs = logits.log_softmax(dim=-1)", "logprobs = logits", "test_beams.py"),
    Mistake(3, "sums not accumulated over steps", "beams.py",
            "new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()",
            "new_logprob_sums = topk_logprobs.flatten()", "test_beams.py"),
    Mistake(3, "per-beam top-k grouped wrongly (repeat, not repeat_interleave)", "beams.py",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat(k)", "test_beams.py"),
    Mistake(3, "generate ignores no_repeat_ngram_size", "beams.py",
            "self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)",
            "self.get_topk_non_repeating(logprobs, None, k)", "test_beams.py"),
    Mistake(3, "filter keeps the first k beams, not the best k", "beams.py",
            "best = self.logprob_sums.topk(min(k, len(self))).indices",
            "best = torch.arange(min(k, len(self)))", "test_beams.py"),
    Mistake(3, "terminated beams kept alive", "beams.py",
            "return self[best[~ended]], self[best[ended]]", "return self[best], self[best[ended]]", "test_beams.py"),
    Mistake(3, "n-gram blocking switched off", "beams.py",
            "logprobs = logprobs.masked_fill(blocked > 0, float(\"-inf\"))", "pass", "test_beams.py"),
    Mistake(3, "n-gram blocking skips a history of exactly n tokens", "beams.py",
            "if seq_len >= n:", "if seq_len > n:", "test_beams.py"),
    Mistake(3, "n-gram blocking misses the last n-gram", "beams.py",
            "ngrams = self.tokens.unfold(dimension=1, size=n, step=1)",
            "ngrams = self.tokens[:, :-1].unfold(dimension=1, size=n, step=1)", "test_beams.py"),
    Mistake(3, "n-gram blocking matches the wrong end of the n-gram", "beams.py",
            "live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)",
            "live = (ngrams[:, :, 1:] == tail[:, None, :]).all(dim=-1)", "test_beams.py"),
    Mistake(3, "n-gram tail by negative index (wrong for n = 1)", "beams.py",
            "tail = self.tokens[:, seq_len - (n - 1) :]", "tail = self.tokens[:, -(n - 1) :]", "test_beams.py"),
    Mistake(3, "beam_search does not pass no_repeat_ngram_size", "sampling.py",
            "beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)",
            "beams = beams.generate(k=num_beams)", "test_beams.py"),
    Mistake(3, "beam_search keeps num_return_sequences beams instead of num_beams", "sampling.py",
            "beams, terminated = beams.filter(k=num_beams)",
            "beams, terminated = beams.filter(k=num_return_sequences)", "test_beams.py"),
    Mistake(3, "beam_search drops finished beams", "sampling.py",
            "finished.extend(terminated.logprobs_and_completions())", "pass", "test_beams.py"),
    Mistake(3, "beam_search never returns early", "sampling.py",
            "if len(finished) >= num_return_sequences:\n                return finished[:num_return_sequences]",
            "if False:\n                return finished[:num_return_sequences]", "test_beams.py"),
    Mistake(3, "beam_search puts live beams before finished ones", "sampling.py",
            "finished.extend(beams.logprobs_and_completions())\n        return finished[:num_return_sequences]",
            "return (beams.logprobs_and_completions() + finished)[:num_return_sequences]", "test_beams.py"),
]

# ---------------------------------------------------------------------------------------
# Part 4: KV cache
# ---------------------------------------------------------------------------------------
PART4: list[Mistake] = [
    Mistake(4, "positional offset forgotten", "transformer.py",
            "self.pos_embed(new_tokens, offset=past)", "self.pos_embed(new_tokens)", "test_kv_cache.py"),
    Mistake(4, "positional offset off by one", "transformer.py",
            "self.pos_embed(new_tokens, offset=past)", "self.pos_embed(new_tokens, offset=past + 1)",
            "test_kv_cache.py"),
    Mistake(4, "new keys and values put before the cached ones", "transformer.py",
            "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)",
            "kv = torch.cat([torch.stack([k, v]), past_kv], dim=2)",
            "test_kv_cache.py"),
    Mistake(4, "mask not shifted for cached positions", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=1,", "test_kv_cache.py"),
    Mistake(4, "KeyValueCache.batch reads the position dimension", "transformer.py",
            "return self.shape[2]", "return self.shape[3]", "test_kv_cache.py"),
    Mistake(4, "KeyValueCache.k returns the values", "transformer.py",
            "return self.as_subclass(torch.Tensor)[:, 0]", "return self.as_subclass(torch.Tensor)[:, 1]",
            "test_kv_cache.py"),
    Mistake(4, "sample drops the cache the model returns", "sampling.py",
            "logits, kv_cache = self.model(input_ids[None], kv_cache)",
            "logits, _ = self.model(input_ids[None], kv_cache)", "test_kv_cache.py"),
    Mistake(4, "cache rows tiled, not following the beams' parents", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=torch.arange(len(parents)) % len(self))",
            "test_kv_cache.py"),
    Mistake(4, "cache copied k times in the tiled order", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, KeyValueCache(cache.repeat(1, 1, k, 1, 1, 1)))",
            "test_kv_cache.py"),
    Mistake(4, "children keep the stale cache of the previous step", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, self.kv_cache, cache_rows=parents)", "test_kv_cache.py"),
]

MISTAKES: list[Mistake] = PART1 + PART2 + PART3 + PART4


def plant(mistake: Mistake, workdir: Path) -> Path:
    """Copy solutions/ to ``workdir/exercises`` with ``mistake`` planted; return the package dir."""
    package = workdir / "exercises"
    shutil.copytree(REPO / "solutions", package, ignore=shutil.ignore_patterns("__pycache__"))
    target = package / mistake.file
    source = target.read_text()
    count = source.count(mistake.old)
    if count != 1:
        raise ValueError(f"{mistake.name!r}: expected the text once in solutions/{mistake.file}, found it {count} times")
    target.write_text(source.replace(mistake.old, mistake.new))
    return package


def caught(mistake: Mistake) -> tuple[bool, str]:
    """Run the mistake's test file against the planted copy; True when the tests fail."""
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        workdir = Path(tmp)
        plant(mistake, workdir)
        env = {**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("SAMPLING_COURSE_IMPL", None)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(REPO / "tests" / mistake.tests), "--impl=exercises",
             "-x", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not gpt2", "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml")],
            cwd=workdir, env=env, capture_output=True, text=True,
        )
    # Caught means a test failed on an assertion: not a crash, not an import error.
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    if failed:
        return True, failed[0].removeprefix("FAILED ").split(" - ")[0]
    last = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()[-200:]]
    return False, last[0]


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(prog="sampling-course plant-mistakes", description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, action="append", help="only this part (repeatable)")
    args = parser.parse_args(argv)
    selected = [m for m in MISTAKES if not args.part or m.part in args.part]
    table = Table("part", "planted mistake", "caught", "by", title="Classic mistakes")
    missed = 0
    for mistake in selected:
        ok, detail = caught(mistake)
        missed += not ok
        table.add_row(str(mistake.part), mistake.name, "[green]yes[/]" if ok else "[red]NO[/]", detail[:90])
    console = Console()
    console.print(table)
    console.print(f"{len(selected) - missed}/{len(selected)} planted mistakes caught")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
