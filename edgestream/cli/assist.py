"""The voice assistant: `assist` (a recording in, an answer out) and `serve` (the web app)."""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgestream.cli.common import (
    PRECISION_HELP,
    ChunkMs,
    EndpointSilence,
    LmName,
    PartialLine,
    TextStreamer,
    app,
    quiet_libraries,
    set_threads,
    stderr,
    streaming_options,
    train_app,
    training_progress,
    user_errors,
)

if TYPE_CHECKING:
    from edgestream.asr.streaming import Segment
    from edgestream.asr.transcribe import Transcript
    from edgestream.assist.pipeline import Assistant

ASSIST_PRECISION_HELP = (
    f"The answering model's precision: {PRECISION_HELP} Under q4_1 answer with --method ar: "
    "on the AVX2 CPU measured, its speculative methods were slower than its AR. A rescoring "
    "copy with an adapter stays float32."
)

AssistRescore = Annotated[
    bool,
    typer.Option(help="Rescore the transcript's candidates with the answering model."),
]

AssistRescoreAdapter = Annotated[
    str,
    typer.Option(
        help="'none': rescore with the answering model itself. 'default' (the bundled "
        "transcript adapter) or an adapter file: rescore with a second copy of the model "
        "with it merged (hears better; another copy's memory and load time).",
    ),
]


@app.command()
@user_errors
def assist(
    audio: Annotated[
        Path,
        typer.Argument(
            help="A spoken question: WAV, FLAC or OGG, any rate. - listens to a WAV stream "
            "from a pipe and answers each question when its speaker pauses."
        ),
    ],
    method: Annotated[
        str, typer.Option(help="Answer decoding: ss-pld (streams + prompt lookup), ss or ar.")
    ] = "ss-pld",
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for --method ss (default: bundled).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on answer tokens.")] = 128,
    chunk_ms: ChunkMs = 640,
    lm: LmName = "default",
    rescore: AssistRescore = True,
    rescore_adapter: AssistRescoreAdapter = "none",
    endpoint_silence: EndpointSilence = None,
    compare: Annotated[
        bool | None,
        typer.Option(
            help="Also decode each answer with ar: speedup and exact match "
            "[default: on for a file, off for a live stream, where it would double the wait]."
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help=ASSIST_PRECISION_HELP)] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per question.")
    ] = False,
) -> None:
    """Transcribe a spoken question as a stream, then answer it with the language model.

    Live: `arecord -f S16_LE -r 16000 | edgestream assist -` answers every question you ask
    until Ctrl-C."""
    from edgestream.asr.audio import STDIN
    from edgestream.assist.pipeline import ANSWER_METHODS, Assistant, AssistantConfig
    from edgestream.llm.loading import parse_precision

    live = str(audio) == STDIN
    parse_precision(dtype)
    if method not in ANSWER_METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(ANSWER_METHODS)}")
    if not live and not audio.is_file():
        raise FileNotFoundError(f"no such audio file: {audio}")
    set_threads(threads)
    quiet_libraries()
    config = AssistantConfig(
        asr_model=asr_model,
        llm=llm,
        dtype=dtype,
        streams_path=streams,
        streaming=streaming_options(chunk_ms, 4, None, lm, endpoint_silence=endpoint_silence),
        max_new_tokens=max_new_tokens,
        rescore=rescore,
        rescore_adapter=rescore_adapter,
    )
    assistant = Assistant.load(config)
    reply = Replier(assistant, method, not live if compare is None else compare, json_output)
    line = PartialLine(terminal_only=True)  # the transcript is printed in full below
    if live:
        _assist_live(assistant, reply, line)
        return
    transcript = assistant.transcribe(audio, None if json_output else line.show)
    line.clear()
    if not transcript.text.strip():
        raise ValueError(f"no speech recognised in {audio}")
    reply(transcript.text, transcript.to_json(), transcript)


def _assist_live(assistant: Assistant, reply: Replier, line: PartialLine) -> None:
    """Answer each segment of standard input's stream as its endpoint closes it. Audio goes on
    being read meanwhile, so a question asked during an answer is heard, and answered next."""
    from edgestream.asr.transcribe import interrupt_stops

    def answer(question: Segment) -> None:
        line.clear()
        reply(question.text, {"audio": "-", **question.to_json()})

    if not reply.json_output:
        stderr.print("[dim]listening: ask, then pause to be answered; Ctrl-C ends[/dim]")
    stop = threading.Event()
    with interrupt_stops(stop):
        transcript = assistant.transcribe(
            "-", None if reply.json_output else line.show, answer, stop
        )
    line.clear()
    if transcript.interrupted:
        raise typer.Exit(130)  # as a shell reports an interrupted command


class Replier:
    """Answers a question and prints it: the answer streamed as it is decoded, then its speed;
    or, with --json, one object with the transcript and the answer."""

    def __init__(self, assistant: Assistant, method: str, compare: bool, json_output: bool) -> None:
        self.assistant, self.method, self.compare = assistant, method, compare
        self.json_output = json_output

    def __call__(
        self,
        question: str,
        transcript_json: dict[str, object],
        transcript: Transcript | None = None,
    ) -> None:
        assistant, method = self.assistant, self.method
        streamer = None if self.json_output else TextStreamer(assistant.lm.decode)
        if streamer is not None:
            print(f"you: {question}", flush=True)
            sys.stdout.write("assistant: ")
        answer = assistant.answer(question, method, streamer, compare=self.compare)
        if streamer is None:
            record = {"transcript": transcript_json, "answer": answer.to_json()}
            print(json.dumps(record, ensure_ascii=False), flush=True)
            return
        sys.stdout.write(answer.text[streamer.printed :] + "\n")
        sys.stdout.flush()
        result = answer.result
        speech = (
            ""
            if transcript is None
            else f"speech: {transcript.duration:.1f} s at RTF {transcript.rtf:.3f}; "
        )
        stderr.print(
            f"[dim]{speech}answer: {result.new_tokens} tokens, "
            f"{result.tokens_per_second:.1f} tokens/s, "
            f"{result.mean_accepted:.2f} tokens/pass ({method})[/dim]"
        )
        if answer.baseline is not None:
            same = "identical" if answer.identical_to_ar else "DIFFERENT"
            stderr.print(
                f"[bold]ar {answer.baseline.tokens_per_second:.1f} tokens/s, {method} "
                f"{result.tokens_per_second:.1f} tokens/s: {answer.speedup:.2f}x, "
                f"output {same}[/bold]"
            )


@app.command()
@user_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="EDGESTREAM_TOKEN",
            help="Require this bearer token on every endpoint (or set EDGESTREAM_TOKEN).",
        ),
    ] = None,
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for ss (default: bundled).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Default upper bound on answers.")] = 128,
    max_streams: Annotated[int, typer.Option(help="Concurrent audio streams allowed.")] = 16,
    lm: LmName = "default",
    rescore: AssistRescore = True,
    rescore_adapter: AssistRescoreAdapter = "none",
    endpoint_silence: EndpointSilence = None,
    dtype: Annotated[str, typer.Option(help=ASSIST_PRECISION_HELP)] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
) -> None:
    """Serve the voice assistant: a web page, streaming transcription and answers."""
    from edgestream.assist.pipeline import Assistant, AssistantConfig
    from edgestream.serve.app import ServerSettings, listening_socket, run_server

    if not 0 < port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {port}")
    if token is not None and not token.strip():
        raise ValueError("--token is empty")
    if max_streams < 1:
        raise ValueError(f"--max-streams must be at least 1, got {max_streams}")
    from edgestream.llm.loading import parse_precision

    parse_precision(dtype)
    # A taken port fails now, not after the models load. Should loading fail, the command
    # exits and the socket closes with it.
    sock = listening_socket(host, port)
    set_threads(threads)
    quiet_libraries()
    config = AssistantConfig(
        asr_model=asr_model,
        llm=llm,
        dtype=dtype,
        streams_path=streams,
        streaming=streaming_options(640, 4, None, lm, endpoint_silence=endpoint_silence),
        max_new_tokens=max_new_tokens,
        rescore=rescore,
        rescore_adapter=rescore_adapter,
    )
    assistant = Assistant.load(config)
    methods = assistant.methods()  # loads the stream weights now, not on the first request
    settings = ServerSettings(token=token, max_streams=max_streams)
    page = f"http://{host}:{port}/" + ("?token=YOUR_TOKEN" if token else "")
    stderr.print(f"answers with {', '.join(methods)}; open {page}")
    if host not in ("127.0.0.1", "localhost", "::1") and token is None:
        stderr.print("[bold]warning: listening beyond loopback without --token[/bold]")
    run_server(assistant, settings, sock)


@train_app.command("rescorer")
@user_errors
def train_rescorer_command(
    out: Annotated[Path, typer.Option(help="Run folder (resumed if it holds a checkpoint).")],
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    text: Annotated[
        Path | None, typer.Option(help="Plain text to learn from (default: the task text).")
    ] = None,
    data: Annotated[Path | None, typer.Option(help="Shared data folder (sentence source).")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 900,
    batch: Annotated[int, typer.Option(help="Sentences per step (per process).")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 1e-3,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 50,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    held_out: Annotated[
        int, typer.Option(help="Held-out sentences whose perplexity is reported before and after.")
    ] = 400,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Tokens kept of each training line (default: enough for all but a tenth of a "
            "percent of single sentences); raise it for lines of several joined sentences.",
        ),
    ] = None,
    init_adapter: Annotated[
        Path | None,
        typer.Option(
            help="Start from this adapter (e.g. the bundled one) instead of from zero; its LoRA "
            "rank and alpha replace --lora-rank."
        ),
    ] = None,
    export: Annotated[Path | None, typer.Option(help="Write the adapter here.")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads per process.")] = None,
) -> None:
    """Adapt the language model to transcripts (LoRA, next-token loss), for `--rescore`.

    Without --text it learns from the train split of the task text, normalised like
    transcripts (the word trigram's text); its held-out sentences are the dev split's. With
    --text, any UTF-8 text, normalised the same way; every 50th sentence is held out.
    --init-adapter continues an earlier adapter on new text (a few hundred steps instead of
    a whole run)."""
    import time

    from edgestream.asr.text import lm_sentences, load_splits, text_sentences
    from edgestream.assist.transcript_lm import (
        MAX_SENTENCE_TOKENS,
        nats_per_token,
        transcript_records,
    )
    from edgestream.llm.loading import load_language_model, training_dtype
    from edgestream.llm.lora import LoRAConfig
    from edgestream.llm.shared import read_adapter, save_adapter, train_shared
    from edgestream.llm.train import TrainConfig
    from edgestream.training import distributed_context

    config = TrainConfig(
        steps=steps, batch_sequences=batch, positions_per_sequence=64, lr=lr, warmup_steps=warmup
    )
    start = read_adapter(init_adapter) if init_adapter is not None else None
    lora_config = start.lora_config if start else LoRAConfig(rank=lora_rank, alpha=2.0 * lora_rank)
    if text is not None:
        every = text_sentences(text)
        training, held = [s for i, s in enumerate(every) if i % 50], every[::50]
    else:
        training, held = lm_sentences(data), list(load_splits(data).dev)
    held = held[:: max(1, len(held) // held_out)][:held_out] if held_out > 0 else []
    set_threads(threads)
    quiet_libraries()
    rank, world = distributed_context()
    lm = load_language_model(model, training_dtype(), pack=False)  # LoRA needs plain layers
    before = nats_per_token(lm, held) if held and rank == 0 else None
    max_tokens = MAX_SENTENCE_TOKENS if max_tokens is None else max_tokens
    records = transcript_records(lm, training, max_tokens)
    started = time.time()
    with training_progress("token", config.steps, rank, started) as (_bar, report):
        weights = train_shared(
            lm.model,
            records,
            lora_config,
            None,
            config,
            out,
            model,
            report,
            init_lora=start.lora if start else None,
        )
    if rank != 0:
        return
    after = nats_per_token(lm, held) if held else None
    info = {
        "model": model,
        "purpose": "rescoring transcripts",
        "text": str(text) if text is not None else "task text, train split",
        "sentences": len(records),
        "max_tokens": max_tokens,
        "init_adapter": str(init_adapter) if init_adapter is not None else None,
        "held_out_sentences": len(held),
        "held_out_nats_per_token": [before and round(before, 4), after and round(after, 4)],
        "processes": world,
        "train_config": config.__dict__,
        "wall_seconds": round(time.time() - started),
    }
    target = export or out / "adapter.safetensors"
    save_adapter(weights, lora_config, target, info)
    if held:
        stderr.print(
            f"held-out perplexity ({len(held)} sentences): {math.exp(before):.1f} before, "
            f"{math.exp(after):.1f} after"
        )
    stderr.print(f"adapter: {target} ({len(records):,} sentences, {info['wall_seconds']} s)")
