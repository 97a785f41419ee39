"""Recorders: a model wrapper and a text file that keep what they were given, for a test to read.

A test of a cached decoding loop checks how the loop calls its model (the positions it passes,
the positions already cached); a test of a streamer checks each write it makes. ``RecordingModel``
and ``RecordingFile`` keep those.

They live in the course's runtime so that they can be made beside the code they are handed to
(``sampling_course.beside``): a submission graded in another process calls them where it runs,
and the test reads what they kept as plain data.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["RecordingFile", "RecordingModel"]


class RecordingModel(nn.Module):
    """Wraps a model and records, for every call, (positions passed, positions cached or None)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens: Tensor, kv_cache: Any = None) -> Any:
        self.calls.append((tokens.shape[1], None if kv_cache is None else kv_cache.seq_len))
        return self.model(tokens) if kv_cache is None else self.model(tokens, kv_cache)


class RecordingFile:
    """A text file that keeps every non-empty write separately (``chunks``)."""

    def __init__(self) -> None:
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        if text:
            self.chunks.append(text)
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""
