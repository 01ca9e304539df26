"""Facts about the machine and library versions, written down next to every measurement."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, or the platform's best guess elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine_facts(threads: int) -> dict[str, object]:
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "edgestream": _version("edgestream"),
    }


def peak_rss_mib() -> float | None:
    """This process's peak resident memory since it started (VmHWM), in MiB; None off Linux.

    Not `getrusage`/`wait4`'s ru_maxrss: on Linux that keeps the high-water mark of the memory
    image before `exec`, i.e. the parent's at fork time (measured: every benchmark child of a
    563 MiB parent reported exactly 563 MiB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
