# GENERATED from solutions/batched_beam_search.py by `sampling-course make-exercises`.
# Given code: nothing to fill in here; it runs on the exercises of the other files.
# stub-checksum: fd870e4de3a717f45d38f59e758d5f301910cc842dfce96f302f38b2a5f55340
"""Part 5b: Hugging Face's beam search inside the engine, over a left-padded batch of prompts.

Part 3 searched one prompt's beams with a loop written for teaching; here every prompt of a
batch runs its beams as rows of one batch and one KV cache, with Hugging Face's rules:
``length_penalty`` ranks finished beams, ``early_stopping`` says when a prompt's search
ends, and part 3's ``BeamHypotheses`` keeps each prompt's best finished beams.
``generate(..., num_beams=n)`` calls it.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings

from .beams import BeamHypotheses
from .outputs import GenerateOutput
from .padding import decode_step, prefill
from .penalties import process_logits
from .transformer import DemoTransformer


def beam_generate(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    max_new_tokens: int,
    settings: SamplerSettings,
    eos_token_id: int | None,
    num_beams: int,
    num_return_sequences: int,
    length_penalty: float,
    early_stopping: bool | str,
    pad_token_id: int,
    return_dict: bool,
) -> Int[Tensor, "rows seq"] | GenerateOutput:
    """Hugging Face's beam search for every prompt of a left-padded batch at once.

    Each prompt runs ``num_beams`` beams (rows of one batch and one KV cache). Every step
    scores each beam's next tokens with log-probabilities after the processors (the
    penalties, banned words, ``min_new_tokens``; no chain), adds them to the beam's sum and
    takes the ``2 * num_beams`` best candidates of each prompt. Candidates ending in EOS
    among its ``num_beams`` best are finished: part 3's ``BeamHypotheses`` keeps the best
    ``num_beams`` of them by length-normalised score and says when the search may stop
    (``early_stopping``). The best ``num_beams`` candidates that did not end run on (the
    beams are refilled). At ``max_new_tokens`` the best ``num_beams`` candidates all
    finish. Returns every prompt's ``num_return_sequences`` best sequences (rows grouped
    by prompt, best first), padded at the end with the pad token.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    eos = eos_token_id
    rows = input_ids.repeat_interleave(num_beams, dim=0)
    mask = attention_mask.repeat_interleave(num_beams, dim=0)
    # At the first step every beam of a prompt is the prompt: only the first may propose, or
    # the best candidate would come num_beams times.
    sums = torch.zeros(batch, num_beams, device=device)
    sums[:, 1:] = -1e9
    # Each beam's tokens so far, and the processed and raw log-probability of each.
    history = torch.empty(batch * num_beams, 0, dtype=torch.long, device=device)
    scores = torch.empty(batch * num_beams, 0, device=device)
    raw_scores = torch.empty(batch * num_beams, 0, device=device)
    finished = [BeamHypotheses(num_beams, length_penalty, early_stopping, max_new_tokens) for _ in range(batch)]
    done = [max_new_tokens == 0] * batch
    cache = None
    for step in range(max_new_tokens):
        length = step + 1
        if cache is None:
            logits, cache = prefill(model, rows, mask)
        else:
            logits, cache = decode_step(model, rows, mask, cache)
        raw = logits.log_softmax(dim=-1)
        processed = process_logits(raw, rows, mask, step, settings, eos_token_id)
        d_vocab = processed.shape[-1]
        totals = (sums.reshape(-1, 1) + processed).reshape(batch, num_beams * d_vocab)
        top_sums, top_index = totals.topk(2 * num_beams, dim=-1)
        parents = top_index // d_vocab + torch.arange(batch, device=device)[:, None] * num_beams
        tokens = top_index % d_vocab
        ended = tokens == eos if eos is not None else torch.zeros_like(tokens, dtype=torch.bool)
        if length == max_new_tokens:
            ended[:] = True  # at the last step every candidate ends
        keep_rows, keep_tokens, keep_sums = [], [], []
        for b in range(batch):
            live = []
            for rank in range(2 * num_beams):
                parent, token = int(parents[b, rank]), int(tokens[b, rank])
                if bool(ended[b, rank]):
                    if rank < num_beams and not done[b]:
                        new = (
                            torch.cat([history[parent], tokens.new_tensor([token])]),
                            torch.cat([scores[parent], processed[parent, token : token + 1]]),
                            torch.cat([raw_scores[parent], raw[parent, token : token + 1]]),
                        )
                        finished[b].add(float(top_sums[b, rank]), length, new)
                elif len(live) < num_beams:
                    live.append(rank)
            if len(live) < num_beams:  # only at the last step, when nothing runs on
                live += [r for r in range(2 * num_beams) if r not in live][: num_beams - len(live)]
            keep_rows.append(parents[b, live])
            keep_tokens.append(tokens[b, live])
            keep_sums.append(top_sums[b, live])
        chosen, new_tokens = torch.cat(keep_rows), torch.cat(keep_tokens)
        sums = torch.stack(keep_sums)
        history = torch.cat([history[chosen], new_tokens[:, None]], dim=1)
        scores = torch.cat([scores[chosen], processed[chosen, new_tokens][:, None]], dim=1)
        raw_scores = torch.cat([raw_scores[chosen], raw[chosen, new_tokens][:, None]], dim=1)
        rows = torch.cat([rows[chosen], new_tokens[:, None]], dim=1)
        mask = torch.cat([mask[chosen], torch.ones_like(mask[:, :1])], dim=1)
        cache = cache[:, :, chosen]
        for b in range(batch):
            done[b] = done[b] or finished[b].is_done(float(sums[b, 0]), length)
        if all(done):
            break

    best = [h for b in range(batch) for h in finished[b].hypotheses[:num_return_sequences]]
    longest = max((len(tokens) for _, _, (tokens, _, _) in best), default=0)
    out = torch.full((len(best), width + longest), pad_token_id, dtype=torch.long, device=device)
    token_scores = torch.full((len(best), longest), float("nan"), device=device)
    token_logprobs = torch.full((len(best), longest), float("nan"), device=device)
    for i, (_, _, (tokens, processed_lp, raw_lp)) in enumerate(best):
        out[i, :width] = input_ids[i // num_return_sequences]
        out[i, width : width + len(tokens)] = tokens
        token_scores[i, : len(tokens)] = processed_lp
        token_logprobs[i, : len(tokens)] = raw_lp
    if not return_dict:
        return out
    return GenerateOutput(out, token_scores, token_logprobs,
                          sequences_scores=torch.tensor([score for score, _, _ in best], device=device))
