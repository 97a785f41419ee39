"""A text file that keeps each write apart, for a test of a streamer to read.

A streamer's test checks each write it makes: the text put together, no write holding a broken
character, a word at a time. ``RecordingFile`` keeps the writes.

It lives in the course's runtime so that it can be made beside the code it is handed to
(``sampling_course.beside``): a submission graded in another process writes to it where it runs,
and the test reads what it kept as plain data.
"""

from __future__ import annotations

__all__ = ["RecordingFile"]


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
