"""Part 5's ``generate`` on a Llama-style model: ``sampling-course generate --model story-llama``.

Part 9's ``LlamaTransformer`` is called as part 5's loop calls its model: ``model(input_ids,
cache, attention_mask=...)`` with the whole sequence so far, ``(logits, cache)`` back for the
positions the cache did not hold yet. So the command runs the implementation's model itself,
in the one engine adapter (``LlamaForEngine``, which adds the engine's ``cfg``), decoding with
its own ``LlamaCache``; the sampler chain, stopping and streaming are part 5's, unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from sampling_course.llama_reference import LlamaReference


def llama_for_generate(reference: "LlamaReference", llama: ModuleType, device: "torch.device | None" = None):
    """The implementation's ``LlamaTransformer`` (module ``llama``) holding the reference's weights, ready for
    part 5's ``generate`` (``engine.model.new_cache()`` gives its cache)."""
    from sampling_course.llama_engine import LlamaForEngine
    from sampling_course.weights import load_weights

    model = load_weights(llama.LlamaTransformer(reference.cfg), reference.weights)
    return LlamaForEngine(model).to(reference.device if device is None else device).eval()
