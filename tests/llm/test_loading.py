"""Finding and loading models: aliases, local directories, the conversion cache, bad paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgestream.llm import loading
from edgestream.llm.loading import cache_root, load_language_model, parse_dtype, resolve_model


def test_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-7'"):
        resolve_model("gpt-7")


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_non_llama_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="holds a 'bert' model"):
        resolve_model(str(tmp_path))


def test_corrupt_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve_model(str(tmp_path))


def test_non_gguf_file_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=r"not a \.gguf file"):
        resolve_model(str(weights))


def test_corrupt_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF model"):
        resolve_model(str(fake))


def test_corrupt_weights_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="could not load model"):
        load_language_model(str(broken))


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        parse_dtype("float16")


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGESTREAM_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("EDGESTREAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "edgestream"


def test_local_directory_loads_with_its_chat_template(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    assert lm.has_chat_template and lm.stop_ids == {lm.tokenizer.eos_token_id}
    chat_ids = lm.encode_prompt("what is the capital of france?")
    plain_ids = lm.encode_prompt("what is the capital of france?", chat=False)
    assert lm.tokenizer.decode(chat_ids).startswith("<|im_start|>user\n")
    assert len(chat_ids) > len(plain_ids)
    with pytest.raises(ValueError, match="prompt is empty"):
        lm.encode_prompt("   ")


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_training_runs_in_bfloat16_only_where_the_cpu_has_it_natively(
    monkeypatch: pytest.MonkeyPatch, native: bool, expected: str
) -> None:
    # Emulated bfloat16 made a shared-mode step ~38x slower than float32 on an AVX2-only CPU.
    monkeypatch.setattr(loading, "native_bfloat16", lambda: native)
    assert loading.training_dtype() == expected


def test_loading_prints_no_progress_bar_and_leaves_the_callers_setting(
    tiny_model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    load_language_model(str(tiny_model_dir))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_text_deltas_hold_back_an_unfinished_character(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    text = "the café 🙂 is open"
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    deltas = lm.text_deltas()
    pieces = [deltas(token) for token in ids]
    assert "".join(pieces) == lm.decode(ids) == text
    assert "" in pieces and not any("\ufffd" in piece for piece in pieces)
    assert deltas.sent == len(text)
