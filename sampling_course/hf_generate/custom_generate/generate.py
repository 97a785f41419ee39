"""The folder form of the course's ``custom_generate``.

Hugging Face runs this file when ``generate`` is given the folder above it:

    model.generate(**inputs, custom_generate=str(CUSTOM_GENERATE_FOLDER), trust_remote_code=True)

It receives every argument of that call (``model`` in place of ``self``) and hands them back to
Hugging Face's own ``generate``, with the course's loop as the decoding method, so the prompts,
the generation config and the cache are prepared exactly as for any other method.
"""

from transformers.generation.utils import GenerationMixin

from sampling_course.hf_generate.engine import course_decoding


def generate(model, **arguments):
    # The tokenizer Hugging Face takes for stop strings also reads token texts for DRY.
    if arguments.get("tokenizer") is not None:
        arguments.setdefault("text_tokenizer", arguments["tokenizer"])
    return GenerationMixin.generate(model, custom_generate=course_decoding, **arguments)
