"""A trained recognizer in one safetensors file: weights, config, CMVN and vocabulary.

Everything a `Recognizer` needs travels in the file's metadata (JSON strings), so a model is
one file to copy, and loading it executes no code (unlike a pickled checkpoint).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from edgestream.asr.conformer import ConformerConfig, ConformerCTC
from edgestream.asr.decode import Vocabulary, vocabulary_from_metadata
from edgestream.asr.features import GlobalCmvn

if TYPE_CHECKING:
    pass

FORMAT = "edgestream-conformer-ctc/1"
WEIGHTS_DIR = Path(__file__).parent / "weights"
BUNDLED = {"default": WEIGHTS_DIR / "conformer-ctc-default.safetensors"}


@dataclass
class AsrModel:
    model: ConformerCTC
    cmvn: GlobalCmvn
    vocabulary: Vocabulary
    info: dict[str, object]  # how it was trained (free-form)
    path: Path

    def chunk_encoder(self, max_cached: int) -> TorchChunkEncoder:
        return TorchChunkEncoder(self.model, max_cached)


class TorchChunkEncoder:
    """One stream's encoder in PyTorch: `forward_chunk` with growing, then trimmed, caches."""

    def __init__(self, model: ConformerCTC, max_cached: int) -> None:
        self.model, self.max_cached = model, max_cached
        self.caches = model.empty_cache()

    @torch.inference_mode()
    def __call__(self, window: np.ndarray, offset: int) -> np.ndarray:
        x = self.model.subsampling(torch.from_numpy(window).unsqueeze(0))
        log_probs, self.caches = self.model.forward_chunk(x, offset, self.caches, self.max_cached)
        return log_probs[0].numpy()


def save_model(
    path: Path,
    model: ConformerCTC,
    cmvn: GlobalCmvn,
    vocabulary: Vocabulary,
    info: dict[str, object],
) -> None:
    """Write atomically (temporary file, then rename)."""
    metadata = {
        "format": FORMAT,
        "config": json.dumps(model.config.to_dict()),
        "cmvn": json.dumps(cmvn.to_dict()),
        **vocabulary.to_metadata(),
        "info": json.dumps(info),
    }
    temporary = path.with_name(f".{path.name}.tmp")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(temporary), metadata=metadata)
    os.replace(temporary, path)


def resolve_model_path(name: str | Path) -> Path:
    if str(name) in BUNDLED:
        path = BUNDLED[str(name)]
        if not path.is_file():
            raise FileNotFoundError(f"the bundled ASR model {name!r} is missing from {path}")
        return path
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"unknown ASR model {str(name)!r}: expected one of {sorted(BUNDLED)} or a "
            ".safetensors file written by `edgestream train asr`"
        )
    return path


def load_model(name: str | Path = "default") -> AsrModel:
    """A bundled model by name, or a model file; clear errors for anything else."""
    path = resolve_model_path(name)
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error})") from error
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"{path} is not an edgestream ASR model (format {metadata.get('format')!r})"
        )
    config = ConformerConfig(**json.loads(metadata["config"]))
    model = ConformerCTC(config)
    model.load_state_dict(tensors)
    model.eval().requires_grad_(False)
    return AsrModel(
        model,
        GlobalCmvn.from_dict(json.loads(metadata["cmvn"])),
        vocabulary_from_metadata(metadata),
        json.loads(metadata["info"]),
        path,
    )
