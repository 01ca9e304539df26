"""The server over real loopback sockets: transcription streams, answers, limits and the token."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from edgestream.asr.transcribe import transcribe_file, transcribe_samples
from edgestream.serve.app import ServerSettings
from tests.serve.conftest import pcm16_pieces, samples_of

END = json.dumps({"type": "end"})


def _reference(assistant: object, clip: Path) -> str:
    """What the recognizer makes of the clip in-process: the server must say exactly this."""
    return transcribe_samples(assistant.asr, samples_of(clip), assistant.streaming)


async def _transcribe(
    address: str, clip: Path, query: str = "", segments: list[dict] | None = None
) -> tuple[list[dict], dict]:
    """Stream a clip as a client would; returns (partials, final), and collects the segments
    in `segments` where given."""
    async with connect(f"ws://{address}/ws/transcribe{query}") as ws:
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready" and ready["sample_rate"] == 16_000
        partials: list[dict] = []

        async def read_until_final() -> dict:
            while True:
                message = json.loads(await ws.recv())
                if message["type"] == "final":
                    return message
                if message["type"] == "segment" and segments is not None:
                    segments.append(message)
                    continue
                assert message["type"] in ("partial", "segment"), message
                if message["type"] == "partial":
                    partials.append(message)

        reader = asyncio.create_task(read_until_final())
        for piece in pcm16_pieces(clip):
            await ws.send(piece)
        await ws.send(END)
        return partials, await asyncio.wait_for(reader, 120)


def _events(response: httpx.Response) -> list[tuple[str, dict]]:
    events = []
    for block in response.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_health_and_schema(server: str) -> None:
    health = httpx.get(f"http://{server}/health").json()
    assert health["status"] == "ok" and health["methods"] == ["ss-pld", "ss", "ar"]
    assert health["active_streams"] == 0
    schema = httpx.get(f"http://{server}/openapi.json").json()
    assert {"/health", "/api/generate"} <= set(schema["paths"])


def test_the_page_and_its_scripts_are_served(server: str) -> None:
    page = httpx.get(f"http://{server}/")
    assert page.status_code == 200 and 'id="transcript"' in page.text
    for name in ("app.js", "pcm-worklet.js"):
        script = httpx.get(f"http://{server}/static/{name}")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.get(f"http://{server}/static/..%2Fapp.py").status_code == 404


def test_one_stream_gets_partials_and_the_offline_text(
    server: str, assistant: object, spoken_questions: list[Path]
) -> None:
    clip = spoken_questions[0]
    partials, final = asyncio.run(_transcribe(server, clip))
    assert final["text"] == _reference(assistant, clip) != ""
    assert final["duration"] == pytest.approx(len(samples_of(clip)) / 16_000, abs=1e-3)
    assert partials, "expected partial results before the final one"
    assert final["text"].startswith(partials[-1]["text"].split()[0])


def test_each_stretch_of_speech_is_sent_once_as_a_segment(
    server: str, assistant: object, spoken_questions: list[Path], tmp_path: Path
) -> None:
    # Two questions 1.5 s apart: an endpoint closes the first, the end of audio the second.
    pause = np.zeros(24_000, np.float32)
    both = tmp_path / "both.wav"
    sf.write(
        both,
        np.concatenate([samples_of(spoken_questions[2]), pause, samples_of(spoken_questions[3])]),
        16_000,
        subtype="PCM_16",
    )
    expected: list[str] = []
    transcribe_file(assistant.asr, both, assistant.streaming, on_segment=expected.append)
    segments: list[dict] = []
    _, final = asyncio.run(_transcribe(server, both, segments=segments))
    assert len(expected) == 2 and [s["text"] for s in segments] == [e.text for e in expected]
    assert [(s["start"], s["end"]) for s in segments] == [
        (round(e.start_s, 2), round(e.end_s, 2)) for e in expected
    ]
    assert final["text"] == " ".join(s["text"] for s in segments)


def test_eight_concurrent_streams_each_get_their_own_text(
    server: str, assistant: object, spoken_questions: list[Path]
) -> None:
    async def all_at_once() -> list[tuple[list[dict], dict]]:
        return await asyncio.gather(*(_transcribe(server, c) for c in spoken_questions))

    results = asyncio.run(all_at_once())
    texts = [final["text"] for _, final in results]
    assert texts == [_reference(assistant, c) for c in spoken_questions]
    assert len(set(texts)) == len(texts)  # eight different questions, eight different texts
    for clip, (_, final) in zip(spoken_questions, results, strict=True):  # no audio dropped
        assert final["duration"] == pytest.approx(len(samples_of(clip)) / 16_000, abs=1e-3)


def test_one_connection_carries_several_utterances(
    server: str, assistant: object, spoken_questions: list[Path]
) -> None:
    async def two() -> list[str]:
        async with connect(f"ws://{server}/ws/transcribe") as ws:
            await ws.recv()
            texts = []
            for clip in spoken_questions[:2]:
                for piece in pcm16_pieces(clip):
                    await ws.send(piece)
                await ws.send(END)
                while (message := json.loads(await ws.recv()))["type"] != "final":
                    pass
                texts.append(message["text"])
            return texts

    assert asyncio.run(two()) == [_reference(assistant, c) for c in spoken_questions[:2]]


def _wait_for_idle(address: str) -> int:
    deadline = time.monotonic() + 10
    while (active := httpx.get(f"http://{address}/health").json()["active_streams"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return active


def test_a_client_that_leaves_mid_stream_frees_its_stream(
    server: str, assistant: object, spoken_questions: list[Path]
) -> None:
    async def leave() -> None:
        ws = await connect(f"ws://{server}/ws/transcribe")
        await ws.recv()
        for piece in pcm16_pieces(spoken_questions[1])[:10]:
            await ws.send(piece)
        ws.transport.abort()  # no closing handshake: the client just vanishes

    asyncio.run(leave())
    assert _wait_for_idle(server) == 0
    _, final = asyncio.run(_transcribe(server, spoken_questions[2]))  # the server still serves
    assert final["text"] == _reference(assistant, spoken_questions[2])


def test_malformed_messages_get_an_error_and_the_stream_goes_on(
    server: str, assistant: object, spoken_questions: list[Path]
) -> None:
    async def misbehave() -> tuple[list[str], str]:
        async with connect(f"ws://{server}/ws/transcribe") as ws:
            await ws.recv()
            errors = []
            for bad in ("hello", '{"type": "pause"}', "[1, 2]", b"\x00\x01\x02"):
                await ws.send(bad)
                message = json.loads(await ws.recv())
                assert message["type"] == "error"
                errors.append(message["message"])
            for piece in pcm16_pieces(spoken_questions[3]):
                await ws.send(piece)
            await ws.send(END)
            while (message := json.loads(await ws.recv()))["type"] != "final":
                pass
            return errors, message["text"]

    errors, text = asyncio.run(misbehave())
    assert "expected binary PCM16 audio" in errors[0] and "odd byte count" in errors[3]
    assert text == _reference(assistant, spoken_questions[3])


def test_a_client_flooding_audio_is_slowed_down_not_buffered(
    serve: Callable[..., object], assistant: object
) -> None:
    """Five minutes of audio sent as fast as the socket takes it, responses unread. The server
    reads a message only once it has processed the previous one, so with small kernel buffers
    the client can finish sending only shortly before the server finishes recognising: the
    flood waits in the client, not in the server's memory. None of it is dropped."""
    pieces = 3000  # 100 ms each

    async def flood(address: str) -> tuple[float, float, dict]:
        host, port = address.split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)
        sock.connect((host, int(port)))
        async with connect(f"ws://{address}/ws/transcribe", sock=sock, max_queue=None) as ws:
            await ws.recv()
            began = time.perf_counter()
            for _ in range(pieces):
                await ws.send(bytes(3200))
            sent = time.perf_counter() - began
            await ws.send(END)
            while (message := json.loads(await ws.recv()))["type"] != "final":
                pass
            return sent, time.perf_counter() - began, message

    with serve(assistant, ServerSettings(), receive_buffer=16_384) as address:
        sent, done, final = asyncio.run(flood(address))
    assert final["duration"] == pieces / 10  # every sample was recognised
    # Unbounded buffering would let the client finish in a few percent of the time.
    assert sent > 0.5 * done, f"sent in {sent:.2f} s, recognised in {done:.2f} s"


@pytest.mark.parametrize("factor", [1.5, 8])
def test_oversized_audio_messages_are_refused(
    serve: Callable[..., object], assistant: object, factor: float
) -> None:
    """Within 4x the limit the app explains; beyond it the protocol cuts the frame off."""
    settings = ServerSettings(max_message_bytes=6400)

    async def flood(address: str) -> tuple[list[dict], int | None]:
        async with connect(f"ws://{address}/ws/transcribe", max_size=None) as ws:
            await ws.recv()
            await ws.send(bytes(int(6400 * factor)))
            received = []
            try:
                while True:
                    received.append(json.loads(await ws.recv()))
            except ConnectionClosed as closed:
                return received, closed.rcvd.code if closed.rcvd else None

    with serve(assistant, settings) as address:
        received, code = asyncio.run(flood(address))
        assert code == 1009
        if factor < 4:
            assert received[0]["type"] == "error" and "limit is 6400" in received[0]["message"]
        assert _wait_for_idle(address) == 0


def test_streams_beyond_the_limit_are_turned_away(
    serve: Callable[..., object], assistant: object
) -> None:
    async def two_clients(address: str) -> tuple[dict, int | None]:
        async with connect(f"ws://{address}/ws/transcribe") as first:
            await first.recv()
            async with connect(f"ws://{address}/ws/transcribe") as second:
                message = json.loads(await second.recv())
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                return message, closed.value.rcvd.code

    with serve(assistant, ServerSettings(max_streams=1)) as address:
        message, code = asyncio.run(two_clients(address))
    assert message["type"] == "error" and "busy" in message["message"] and code == 1013


def test_answers_stream_token_by_token_and_ss_equals_ar(server: str, assistant: object) -> None:
    answers = {}
    for method in ("ar", "ss", "ss-pld"):
        response = httpx.post(
            f"http://{server}/api/generate",
            json={"prompt": "what is the capital of france", "method": method},
            timeout=60,
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "done" and set(kinds[:-1]) == {"token"} and len(kinds) > 2
        done = events[-1][1]
        assert "".join(data["text"] for _, data in events[:-1]) == done["text"]
        assert done["method"] == method and done["tokens_per_second"] > 0
        answers[method] = done
    direct = assistant.answer("what is the capital of france", "ar")
    assert answers["ar"]["text"] == answers["ss"]["text"] == answers["ss-pld"]["text"]
    assert answers["ar"]["text"] == direct.text != ""
    assert answers["ar"]["new_tokens"] == answers["ss"]["new_tokens"] == direct.result.new_tokens


def test_a_failing_decode_ends_the_answer_with_an_error_event(
    server: str, assistant: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in the decoder")

    monkeypatch.setattr(assistant, "answer", broken)  # a fault injected where a bug would be
    response = httpx.post(f"http://{server}/api/generate", json={"prompt": "hi"}, timeout=60)
    assert response.status_code == 200
    assert _events(response) == [
        ("error", {"message": "internal error (RuntimeError); see the server's log"})
    ]


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"prompt": "  "}, 400, "the prompt is empty"),
        ({"prompt": "hi", "method": "beam"}, 400, "unknown method 'beam'"),
        ({"prompt": "x" * 5000}, 400, "longer than 4000 characters"),
        ({"prompt": "hi", "max_new_tokens": 0}, 422, ""),
        ({"method": "ar"}, 422, ""),
    ],
)
def test_bad_generate_requests_are_refused(
    server: str, body: dict, status: int, detail: str
) -> None:
    response = httpx.post(f"http://{server}/api/generate", json=body)
    assert response.status_code == status
    assert detail in json.dumps(response.json()["detail"])


def test_with_a_token_every_endpoint_requires_it(
    serve: Callable[..., object], assistant: object, spoken_questions: list[Path]
) -> None:
    token = "correct horse battery staple"
    with serve(assistant, ServerSettings(token=token)) as address:
        base = f"http://{address}"
        bearer, wrong = {"Authorization": f"Bearer {token}"}, {"Authorization": "Bearer nope"}
        for path in ("/health", "/", "/static/app.js", "/openapi.json"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(base + path, headers=wrong).status_code == 401, path
            assert httpx.get(base + path, headers=bearer).status_code == 200, path
        assert httpx.get(base + "/health", params={"token": token}).status_code == 200
        body = {"prompt": "hello", "method": "ar"}
        assert httpx.post(base + "/api/generate", json=body).status_code == 401
        assert httpx.post(base + "/api/generate", json=body, headers=bearer).status_code == 200

        async def refused() -> int:
            with pytest.raises(InvalidStatus) as rejected:
                async with connect(f"ws://{address}/ws/transcribe"):
                    pass
            return rejected.value.response.status_code

        assert asyncio.run(refused()) == 403
        query = "?" + str(httpx.QueryParams({"token": token}))
        _, final = asyncio.run(_transcribe(address, spoken_questions[4], query))
        assert final["text"] == _reference(assistant, spoken_questions[4])
