"""Part 5's ``generate`` on a Llama-style model: ``sampling-course generate --model story-llama``.

Part 5's loop calls ``model(input_ids, cache, attention_mask=...)`` with the whole sequence so
far and gets ``(logits, cache)`` back for the positions the cache did not hold yet: the masked
``DemoTransformer``'s contract. Part 9's
``LlamaTransformer`` takes ``model(tokens, cache)`` and returns the logits, its ``LlamaCache``
filled in place and giving the next positions. ``LlamaForGenerate`` puts the second behind the
first; the sampler chain, stopping and streaming are part 5's own, unchanged.

Positions come from the cache, not from the attention mask, so the prompt must not be
left-padded (the command decodes one prompt, repeated for ``--num-return-sequences``); a
finished row's later tokens are pads that part 5 throws away, so what they see does not matter.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from sampling_course.llama_reference import LlamaReference


def llama_for_generate(reference: "LlamaReference", llama: ModuleType, device: "torch.device | None" = None):
    """The implementation's ``LlamaTransformer`` (module ``llama``) holding the reference's weights, wrapped for
    part 5's ``generate``."""
    import torch

    from sampling_course.weights import load_weights

    class LlamaForGenerate(torch.nn.Module):
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model, self.cfg = model, model.cfg

        def new_cache(self):
            return self.model.new_cache()

        def forward(self, input_ids, cache, attention_mask=None):
            if cache is None or not hasattr(cache, "seq_len") or not hasattr(cache, "update"):
                raise TypeError("a Llama-style model decodes with its own cache: pass kv_cache=model.new_cache()")
            if cache.seq_len == 0 and attention_mask is not None and not bool(attention_mask.all()):
                raise ValueError("a Llama-style model here takes no left padding: its positions come from the cache")
            # Part 5 hands over the whole sequence so far, as the masked DemoTransformer takes it: run the new part.
            return self.model(input_ids[:, cache.seq_len :], cache), cache

    model = load_weights(llama.LlamaTransformer(reference.cfg), reference.weights)
    return LlamaForGenerate(model).to(reference.device if device is None else device).eval()
