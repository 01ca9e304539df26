"""edgestream: fast, private, on-device transformer inference."""

__version__ = "0.1.0"
