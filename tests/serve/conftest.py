"""A real uvicorn server on a loopback port, serving the test assistant."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import soundfile as sf

from edgestream.serve.app import ServerSettings, make_server

PIECE_BYTES = 3200  # 100 ms of 16 kHz PCM16, as the page sends it


@contextmanager
def running_server(
    assistant: object, settings: ServerSettings, receive_buffer: int | None = None
) -> Iterator[str]:
    """Serve in a thread; yields "127.0.0.1:PORT"; stops the server afterwards.
    `receive_buffer`: the kernel's receive buffer per connection (SO_RCVBUF), in bytes."""
    server = make_server(assistant, settings)  # type: ignore[arg-type]
    sock = socket.socket()
    if receive_buffer is not None:  # accepted connections inherit it (and lose autotuning)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the server did not start")
        time.sleep(0.02)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def server(assistant: object) -> Iterator[str]:
    with running_server(assistant, ServerSettings()) as address:
        yield address


@pytest.fixture
def serve() -> Callable[..., object]:
    """Start a server with other settings: `with serve(assistant, settings) as address:`."""
    return running_server


def pcm16_pieces(path: object, piece_bytes: int = PIECE_BYTES) -> list[bytes]:
    """A 16 kHz mono WAV as the little-endian PCM16 messages a client sends."""
    samples, rate = sf.read(path, dtype="int16")
    assert rate == 16_000 and samples.ndim == 1
    data = samples.astype("<i2").tobytes()
    return [data[i : i + piece_bytes] for i in range(0, len(data), piece_bytes)]


def samples_of(path: object) -> np.ndarray:
    samples, _ = sf.read(path, dtype="float32")
    return samples
