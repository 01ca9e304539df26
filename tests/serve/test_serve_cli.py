"""`edgestream serve`: the command starts a real server; bad options get one error line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from edgestream.cli import app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_starts_answers_health_and_stops(tiny_model_dir: Path) -> None:
    port = _free_port()
    env = {**os.environ, "EDGESTREAM_TOKEN": "t0ken"}
    command = [sys.executable, "-m", "edgestream", "serve", "--llm", str(tiny_model_dir)]
    proc = subprocess.Popen(
        [*command, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline, health = time.monotonic() + 90, None
        while health is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(
                    f"http://127.0.0.1:{port}/health", headers={"Authorization": "Bearer t0ken"}
                )
            except httpx.TransportError:
                time.sleep(0.2)
        assert health is not None, proc.stderr.read() if proc.poll() is not None else "no start"
        assert health.status_code == 200
        assert health.json()["methods"] == ["ar"]  # a local model has no bundled streams
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 401  # token from env
    finally:
        proc.terminate()
        proc.wait(30)
    assert "open http://127.0.0.1:" in proc.stderr.read()


def test_serve_on_a_taken_port_says_so_before_loading_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert time.monotonic() - started < 20  # the models (SmolLM2, the recognizer) never loaded


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "0"], "--port must be in 1..65535"),
        (["--token", " "], "--token is empty"),
        (["--max-streams", "0"], "--max-streams must be at least 1"),
        (["--llm", "no-such-model"], "unknown model"),
        (["--endpoint-silence", "-1"], "--endpoint-silence must be positive"),
        (["--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid"),
    ],
)
def test_serve_refuses_bad_options(args: list[str], message: str) -> None:
    port = [] if "--port" in args else ["--port", str(_free_port())]  # 8000 may be taken
    result = CliRunner().invoke(app, ["serve", *args, *port])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
