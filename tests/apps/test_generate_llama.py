"""``sampling-course generate --model story-llama``: part 5's loop on part 9's Llama-style story model.

Greedy decoding must give the text of Hugging Face's own ``generate`` on ``LlamaForCausalLM``
(the same shipped folder); what only the GPT-2 models support (beam search, part 6's static
cache) is refused in one line naming the models that take it; a command that runs GPT-2 only
refuses the Llama model and names the models it takes.
"""

from __future__ import annotations

import sys

import pytest
import torch


def run_cli(argv, monkeypatch, capsys):
    from sampling_course.apps import generate

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    code = generate.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("model", ["story-llama", "story-llama-sink"])
def test_greedy_text_is_hugging_faces(model, monkeypatch, capsys):
    from sampling_course.reference import load_reference

    prompt, new = "Once upon a time, there was a little", 16
    argv = ["--model", model, "--impl", "solutions", "--device", "cpu", "--prompt", prompt,
            "--max-new-tokens", str(new), "--temperature", "0"]
    code, out, err = run_cli(argv, monkeypatch, capsys)
    assert code == 0, err
    ref = load_reference(model, "cpu")
    ids = torch.tensor([ref.tokenizer(prompt).input_ids])
    with torch.no_grad():
        expected = ref.hf_model.generate(ids, max_new_tokens=new, do_sample=False,
                                         pad_token_id=ref.tokenizer.eos_token_id)
    assert out == ref.tokenizer.decode(expected[0].tolist(), skip_special_tokens=True) + "\n"


@pytest.mark.parametrize("flags", [["--num-beams", "2"], ["--cache", "static"]])
def test_gpt2_only_settings_are_refused(flags, monkeypatch, capsys):
    argv = ["--model", "story-llama", "--impl", "solutions", "--device", "cpu", "--prompt", "Once", "--max-new-tokens",
            "3", *flags]
    code, out, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert "GPT-2 models only (auto, story, gpt2, tiny)" in err


def test_a_gpt2_only_command_names_its_models(capsys):
    from sampling_course.apps import long_text

    assert long_text.main(["--model", "story-llama"]) == 2
    err = capsys.readouterr().err
    assert "story-llama" in err and "'story'" in err and "'gpt2'" in err
