"""The library's front doors: what they export, what they load, and that docs/python-api.md's
examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgestream.asr
import edgestream.assist
import edgestream.llm
from edgestream.asr.lm import LM_BEAM
from edgestream.assist.pipeline import AssistantConfig
from tests.conftest import needs_smollm2

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (edgestream.llm, edgestream.asr, edgestream.assist)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_name_resolves_and_nothing_else_does(package: object) -> None:
    assert sorted(package.__all__) == sorted(package._EXPORTS)
    for name in package.__all__:
        assert name.isupper() or getattr(package, name).__module__ == package._EXPORTS[name]
    with pytest.raises(AttributeError, match="no attribute 'generate'"):
        package.generate  # noqa: B018


def test_the_asr_front_door_does_not_load_pytorch() -> None:
    # The onnxruntime path promises to run without PyTorch: the front door must keep it.
    code = (
        "import sys, edgestream.asr as a; a.Recognizer; a.recommended_options; a.read_audio; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_recommended_options_are_what_transcribe_decodes_with() -> None:
    options = edgestream.asr.recommended_options()
    assert options.beam == LM_BEAM and options.lm is not None
    assert options.chunk_ms == 640 and options.left_chunks == 4
    greedy = edgestream.asr.recommended_options("none", chunk_ms=320)
    assert greedy.beam == 0 and greedy.lm is None and greedy.chunk_ms == 320
    with pytest.raises(TypeError):
        edgestream.asr.recommended_options(beams=8)  # a misspelt field is an error, not ignored


def test_the_assistant_hears_with_the_recommended_decoding_by_default() -> None:
    streaming = AssistantConfig().streaming
    assert streaming.beam == LM_BEAM and streaming.lm is not None


def _examples() -> list[str]:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_page_has_the_three_examples() -> None:
    assert len(_examples()) == 3


@needs_smollm2
def test_the_documented_examples_run_as_written() -> None:
    # One process for the three, as a user would paste them; each asserts what it promises
    # (lossless output, the transcript of the bundled sample, an identical answer).
    script = "\n\n".join(_examples())
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final: why is the sky blue" in out.stdout
    assert "identical: True" in out.stdout


@pytest.mark.parametrize("method", ["ar", "pld", "ss", "ss-pld"])
def test_decoders_take_the_arguments_their_protocol_names(
    method: str, tiny_model_dir: Path, tiny_streams: Path
) -> None:
    lm = edgestream.llm.load_language_model(str(tiny_model_dir))
    options = edgestream.llm.MethodOptions(streams_path=tiny_streams)
    decode = edgestream.llm.make_decoder(method, lm, options)
    prompt = lm.encode_prompt("the quick brown fox")
    seen: list[int] = []
    by_name = decode(prompt_ids=prompt, max_new_tokens=12, on_token=seen.append)
    assert seen == by_name.token_ids == decode(prompt, 12).token_ids
