"""sampling-course: build GPT-2 from scratch, then every decoding method that matters.

This package is the course engine that learners never edit: the model ``Config``,
reference-model loading (real GPT-2 or the offline stand-in), weight conversion,
the stub generator and the command-line interface.
"""

from sampling_course.config import Config

__all__ = ["Config"]
