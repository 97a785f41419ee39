"""The course's engine inside Hugging Face's ``generate``, on any causal LM.

* ``course_decoding``: part 5's loop and sampler chain as a decoding method,
  ``model.generate(**inputs, custom_generate=course_decoding, ...)``;
* ``CUSTOM_GENERATE_FOLDER``: the same as a folder holding ``custom_generate/generate.py``,
  ``model.generate(**inputs, custom_generate=str(CUSTOM_GENERATE_FOLDER), trust_remote_code=True)``;
* ``SinkCache``: part 9's attention-sink cache, which re-rotates the keys it keeps, as a Hugging
  Face ``Cache`` for Llama and Qwen3 models (``past_key_values=SinkCache(model.config, 4, 60)``);
* ``StaticKeyValueCache``: part 6's static cache as a Hugging Face ``Cache`` for any causal LM
  (``past_key_values=StaticKeyValueCache(model.config, batch, max_len)``), with Hugging Face's
  own ``generate`` or the course's loop.

Each runs the implementation you choose (``impl="solutions"``, the default, or ``"exercises"``; in the
student release, which has no solutions, the default is ``"exercises"``).
"""

from pathlib import Path

from sampling_course.hf_generate.engine import course_decoding, sampler_settings
from sampling_course.hf_generate.sink_cache import SinkCache
from sampling_course.hf_generate.static_cache import StaticKeyValueCache

CUSTOM_GENERATE_FOLDER = Path(__file__).parent

__all__ = ["CUSTOM_GENERATE_FOLDER", "SinkCache", "StaticKeyValueCache", "course_decoding", "sampler_settings"]
