"""The assistant over HTTP: a web page, streaming transcription over a WebSocket, and answers
streamed as server-sent events.

Endpoints (all behind the bearer token when one is set; see `_authorized`):
- `GET /`: the page (microphone -> 16 kHz PCM16 in an AudioWorklet -> /ws/transcribe, then the
  answer from /api/generate as it streams).
- `WS /ws/transcribe`: binary messages are 16 kHz mono PCM16 little-endian audio; the text
  message `{"type": "end"}` ends an utterance. The server sends `ready`, `partial`, `segment`
  (each stretch of speech once an endpoint, or the utterance's end, closes it), `final` and
  `error` messages (JSON). After a final the same connection can carry the next utterance.
- `POST /api/generate`: `{"prompt", "method", "max_new_tokens"}` -> `text/event-stream` of
  `token` events (text deltas) and one `done` event (speed) or `error` event.
- `GET /health` and `GET /openapi.json`.

Memory per client is bounded: the server reads a client's next audio message only after the
previous one is processed (TCP then slows a client that sends faster than we compute), messages
larger than `max_message_bytes` are refused, and at most `max_streams` streams run at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
import traceback
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field

from edgestream.assist.pipeline import (
    ANSWER_METHODS,
    DEFAULT_ANSWER_METHOD,
    SAMPLE_RATE,
    Assistant,
    Segment,
)

STATIC_DIR = Path(__file__).parent / "static"
PAGE_FILES = {"app.js": "text/javascript", "pcm-worklet.js": "text/javascript"}
CLOSE_POLICY_VIOLATION = 1008  # WebSocket close codes (RFC 6455)
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013


@dataclass(frozen=True)
class ServerSettings:
    token: str | None = None  # when set, every endpoint requires it
    max_streams: int = 16  # concurrent transcription streams
    max_message_bytes: int = 64_000  # one audio message: 2 s of PCM16 at 16 kHz
    max_prompt_chars: int = 4_000
    max_new_tokens: int = 512  # the most a request may ask for
    asr_workers: int = 2  # threads running recognizers (the model releases the GIL)

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {self.max_streams}")
        if self.max_message_bytes < 2:
            raise ValueError(f"max_message_bytes must be at least 2, got {self.max_message_bytes}")


class GenerateRequest(BaseModel):
    prompt: str = Field(description="The user's message (the chat template is applied).")
    method: str = Field(
        DEFAULT_ANSWER_METHOD, description=f"Decoding method: one of {', '.join(ANSWER_METHODS)}."
    )
    max_new_tokens: int | None = Field(None, ge=1, description="Default: the server's setting.")


def _authorized(settings: ServerSettings, headers: object, query: object) -> bool:
    """A bearer token in the Authorization header, or `?token=` where a browser cannot set
    headers (page loads, WebSockets)."""
    if settings.token is None:
        return True
    given = ""
    authorization = headers.get("authorization", "")  # type: ignore[attr-defined]
    if authorization.lower().startswith("bearer "):
        given = authorization[7:].strip()
    given = given or query.get("token", "")  # type: ignore[attr-defined]
    return hmac.compare_digest(given.encode(), settings.token.encode())


class _Cancelled(Exception):
    """Raised inside a decode when its client has gone away."""


def _sse(event: str, data: dict[str, object]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(assistant: Assistant, settings: ServerSettings = ServerSettings()) -> FastAPI:
    app = FastAPI(
        title="edgestream",
        summary="On-device voice assistant: streaming speech recognition and fast answers.",
        docs_url=None,  # the interactive docs load scripts from a CDN; this server is offline
        redoc_url=None,
        openapi_url=None,  # served below, behind the token like everything else
    )
    asr_pool = ThreadPoolExecutor(settings.asr_workers, thread_name_prefix="asr")
    app.state.active_streams = 0

    def require_token(request: Request) -> None:
        if not _authorized(settings, request.headers, request.query_params):
            raise HTTPException(
                401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
            )

    guarded = [Depends(require_token)]

    @app.get("/health", dependencies=guarded)
    def health() -> dict[str, object]:
        return {
            "status": "ok",
            "asr_model": assistant.config.asr_model,
            "llm": assistant.lm.name,
            "methods": assistant.methods(),
            "active_streams": app.state.active_streams,
            "max_streams": settings.max_streams,
        }

    @app.get("/openapi.json", dependencies=guarded, include_in_schema=False)
    def openapi() -> dict[str, object]:
        return app.openapi()

    @app.get("/", dependencies=guarded, include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/static/{name}", dependencies=guarded, include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in PAGE_FILES:  # a fixed list: no path from the client reaches the disk
            raise HTTPException(404, f"no such file: {name}")
        return FileResponse(STATIC_DIR / name, media_type=PAGE_FILES[name])

    @app.post("/api/generate", dependencies=guarded)
    async def generate(body: GenerateRequest) -> StreamingResponse:
        """Stream an answer as server-sent events: `token` ({"text"}), then `done` (speed)."""
        if not body.prompt.strip():
            raise HTTPException(400, "the prompt is empty")
        if len(body.prompt) > settings.max_prompt_chars:
            raise HTTPException(
                400, f"the prompt is longer than {settings.max_prompt_chars} characters"
            )
        if body.method not in assistant.methods():
            raise HTTPException(
                400, f"unknown method {body.method!r}: expected one of {assistant.methods()}"
            )
        asked = body.max_new_tokens or assistant.config.max_new_tokens
        budget = min(asked, settings.max_new_tokens)
        return StreamingResponse(
            _answer_events(assistant, body.prompt, body.method, budget),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    @app.websocket("/ws/transcribe")
    async def transcribe(websocket: WebSocket) -> None:
        if not _authorized(settings, websocket.headers, websocket.query_params):
            await websocket.close(CLOSE_POLICY_VIOLATION, "a valid bearer token is required")
            return
        await websocket.accept()
        if app.state.active_streams >= settings.max_streams:
            await _send_error(websocket, f"the server is busy ({settings.max_streams} streams)")
            await websocket.close(CLOSE_TRY_AGAIN_LATER)
            return
        app.state.active_streams += 1
        try:
            await _transcribe_stream(websocket, assistant, settings, asr_pool)
        except WebSocketDisconnect:
            pass  # the client left mid-stream: its recognizer goes with this frame
        finally:
            app.state.active_streams -= 1

    return app


async def _answer_events(
    assistant: Assistant, prompt: str, method: str, budget: int
) -> AsyncIterator[str]:
    """Decode in a worker thread; hand each text delta to the event loop as it is produced."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
    gone = threading.Event()
    deltas = assistant.lm.text_deltas()

    def on_token(token: int) -> None:
        if gone.is_set():
            raise _Cancelled
        delta = deltas(token)
        if delta:
            loop.call_soon_threadsafe(queue.put_nowait, ("token", delta))

    def work() -> None:
        try:
            answer = assistant.answer(prompt, method, on_token, budget)
            loop.call_soon_threadsafe(queue.put_nowait, ("done", answer))
        except _Cancelled:
            pass
        except ValueError as err:
            loop.call_soon_threadsafe(queue.put_nowait, ("error", str(err)))
        except Exception as err:  # a bug must end the stream, not leave the client waiting
            traceback.print_exc()  # for whoever runs the server
            message = f"internal error ({type(err).__name__}); see the server's log"
            loop.call_soon_threadsafe(queue.put_nowait, ("error", message))

    worker = threading.Thread(target=work, name="answer", daemon=True)
    worker.start()
    try:
        while True:
            kind, item = await queue.get()
            if kind == "token":
                yield _sse("token", {"text": item})
            elif kind == "error":
                yield _sse("error", {"message": item})
                return
            else:
                text = item.text  # type: ignore[attr-defined]
                if text[deltas.sent :]:  # what was held back: an unfinished character at the end
                    yield _sse("token", {"text": text[deltas.sent :]})
                yield _sse("done", item.to_json())  # type: ignore[attr-defined]
                return
    finally:
        gone.set()  # the client left (or we finished): stop the decode at its next token


async def _send_error(websocket: WebSocket, message: str) -> None:
    await websocket.send_json({"type": "error", "message": message})


async def _transcribe_stream(
    websocket: WebSocket,
    assistant: Assistant,
    settings: ServerSettings,
    pool: ThreadPoolExecutor,
) -> None:
    loop = asyncio.get_running_loop()
    await websocket.send_json(
        {
            "type": "ready",
            "sample_rate": SAMPLE_RATE,
            "format": "pcm16le mono",
            "max_message_bytes": settings.max_message_bytes,
        }
    )
    recognizer, shown, processing, sent_segments = assistant.recognizer(), "", 0.0, 0

    async def send_segments(last: Segment | None = None) -> None:
        """Each segment closed since the last call, once; then `last`, the utterance's end."""
        nonlocal sent_segments
        closed = [recognizer.segment(i) for i in range(sent_segments, len(recognizer.segments))]
        sent_segments = len(recognizer.segments)
        for segment in [*closed, *([last] if last is not None else [])]:
            await websocket.send_json({"type": "segment", **segment.to_json()})

    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        audio, text = message.get("bytes"), message.get("text")
        if audio is not None:
            if len(audio) > settings.max_message_bytes:
                await _send_error(
                    websocket,
                    f"audio message of {len(audio)} bytes; the limit is "
                    f"{settings.max_message_bytes}: send smaller pieces",
                )
                await websocket.close(CLOSE_TOO_BIG)
                return
            if len(audio) % 2:
                await _send_error(websocket, "audio must be 16-bit samples: odd byte count")
                continue
            samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32768.0
            began = time.perf_counter()
            await loop.run_in_executor(pool, recognizer.accept_waveform, samples)
            processing += time.perf_counter() - began
            await send_segments()
            if recognizer.text != shown:
                shown = recognizer.text
                await websocket.send_json({"type": "partial", "text": shown})
            continue
        try:
            command = json.loads(text or "")
        except json.JSONDecodeError:
            command = None
        if not isinstance(command, dict) or command.get("type") != "end":
            await _send_error(
                websocket, 'expected binary PCM16 audio or the text message {"type": "end"}'
            )
            continue
        began = time.perf_counter()
        final = await loop.run_in_executor(pool, recognizer.finalize)
        processing += time.perf_counter() - began
        # the utterance's end closes its last segment
        await send_segments(recognizer.partial_segment)
        seconds = recognizer.seconds
        await websocket.send_json(
            {
                "type": "final",
                "text": final,
                "duration": round(seconds, 3),
                "rtf": round(processing / seconds, 4) if seconds else 0.0,
            }
        )
        recognizer, shown, processing, sent_segments = assistant.recognizer(), "", 0.0, 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening. Made before the models load, so that a port
    in use or an address this machine does not have fails at once, with a one-line reason."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as err:
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock = socket.socket(family, kind, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
    try:
        sock.bind(address)
        sock.listen()
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock


def run_server(assistant: Assistant, settings: ServerSettings, sock: socket.socket) -> None:
    """Serve on a `listening_socket` until interrupted."""
    make_server(assistant, settings).run(sockets=[sock])


def make_server(
    assistant: Assistant, settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000
) -> uvicorn.Server:
    """A uvicorn server for the app; `server.run(sockets=[...])` serves on sockets given."""
    config = uvicorn.Config(
        create_app(assistant, settings),
        host=host,
        port=port,
        ws="websockets-sansio",
        # Frames over 4x the limit are cut off by the protocol (close 1009) before they are
        # buffered; those in between reach the app, which explains the limit to the client.
        ws_max_size=settings.max_message_bytes * 4,
        # No permessage-deflate: PCM barely compresses, and a compressed flood (measured: 9.6 MB
        # of zeros in 75 kB) would be inflated into the server's queue faster than TCP can push
        # back, defeating the bound above.
        ws_per_message_deflate=False,
        log_level="warning",
    )
    return uvicorn.Server(config)
