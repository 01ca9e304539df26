"""Small trained drafters (streams, Medusa heads) as safetensors files with their settings.

The settings and a free-form `info` (how it was trained) travel as JSON in the file's metadata,
so a weights file is self-describing; files are written atomically (temporary, then rename).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn


def save_weights(
    module: nn.Module,
    path: Path,
    config_key: str,
    config: dict,
    info: dict,
    dtype: torch.dtype = torch.float32,
) -> None:
    """`module`'s tensors in `dtype` (float32 unless a smaller file matters more than the last
    bits: loading converts them to the module's own dtype)."""
    from safetensors.torch import save_file

    metadata = {config_key: json.dumps(config), "info": json.dumps(info)}
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in module.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


def read_weights(path: Path, config_key: str, what: str) -> tuple[dict[str, Tensor], dict, dict]:
    """(tensors, settings, info) of a file written by `save_weights`; clear errors otherwise."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} do not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        config = json.loads(metadata[config_key])
        info = json.loads(metadata.get("info", "{}"))
    except (SafetensorError, KeyError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a {what} file: {err}") from err
    return tensors, config, info


def load_into(module: nn.Module, tensors: dict[str, Tensor], path: Path) -> None:
    try:
        module.load_state_dict(tensors)
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit this model: {str(err).splitlines()[0]}") from err


def load_drafter(
    path: Path,
    config_key: str,
    what: str,
    build: Callable[[dict], nn.Module],
    dtype: object,
) -> tuple[nn.Module, dict]:
    """A module saved by `save_weights`: `build(settings)` makes it (a TypeError there means
    foreign settings), its tensors are loaded, and it is returned frozen in `dtype`, with
    its `info`."""
    tensors, settings, info = read_weights(path, config_key, what)
    try:
        module = build(settings)
    except TypeError as err:
        raise ValueError(f"{path} is not a {what} file: {err}") from err
    load_into(module, tensors, path)
    return module.to(dtype).eval().requires_grad_(False), info
