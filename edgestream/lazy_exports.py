"""A package's public names, imported from their modules on first use (PEP 562).

Why lazily: a package's front door should not load every module behind it. Importing one
submodule (say the onnxruntime runtime, which runs without PyTorch) would otherwise import the
whole package, PyTorch included.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `package`: `exports` maps each public name to the
    module that defines it."""

    def module_getattr(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return module_getattr
