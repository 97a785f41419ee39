"""`sampling-course demo` written to a file or a pipe: tables only, no progress-bar debris."""

from __future__ import annotations

from sampling_course.apps import demo
from sampling_course.reference import build_tiny_checkpoint

BAR_DEBRIS = ("\r", "it/s]", "%|")


def test_demo_piped_prints_no_progress_bars(capsys):
    """With stdout and stderr captured (not a terminal), the demo prints its tables and no bar."""
    assert demo.main(["--reference", "tiny", "--max-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    assert "Part 3 · beam search" in out and "Part 4 · KV cache" in out
    for debris in BAR_DEBRIS:
        assert debris not in out and debris not in err, (debris, err[-300:])


def test_building_the_stand_in_shows_no_progress_bar(tmp_path, capfd):
    """The first run builds the stand-in; writing its weights draws no bar, even on the file descriptors."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.enable_progress_bar()  # as in a fresh process, where nothing has turned bars off yet
    try:
        build_tiny_checkpoint(tmp_path)
    finally:
        (logging.enable_progress_bar if was_enabled else logging.disable_progress_bar)()
    out, err = capfd.readouterr()
    assert (tmp_path / "model.safetensors").exists()
    assert not any(debris in out + err for debris in BAR_DEBRIS), err[-300:]
