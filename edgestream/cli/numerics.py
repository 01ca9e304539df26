"""`edgestream numerics ...`: the pre-normalizer report and the float16 activation probe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from edgestream.cli.common import (
    JsonReport,
    numerics_app,
    quiet_libraries,
    show_report,
    stderr,
    user_errors,
    write_report,
)


@numerics_app.command("report")
@user_errors
def numerics_report_command(
    json_path: JsonReport = None,
    seed: Annotated[int, typer.Option(help="Seed of the adversarial suite.")] = 0,
) -> None:
    """Overflow rate and relative error per format and pre-normalizer on adversarial inputs."""
    from edgestream.numerics.report import numerics_report, report_table

    report = numerics_report(seed=seed)
    Console().print(report_table(report))
    write_report(report, json_path)


@numerics_app.command("activations")
@user_errors
def numerics_activations_command(
    audio: Annotated[
        list[Path] | None, typer.Option(help="Speech for the Conformer (default: the sample).")
    ] = None,
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per float16 decode.")] = 32,
    json_path: JsonReport = None,
) -> None:
    """Norms on real activations (Conformer, SmolLM2) and SmolLM2 decoded in float16."""
    from rich.table import Table

    from edgestream.asr.audio import read_audio
    from edgestream.asr.model_io import load_model
    from edgestream.bench.activations import activations_study
    from edgestream.bench.generate import DEFAULT_PROMPTS
    from edgestream.llm.loading import load_language_model
    from edgestream.numerics.report import report_table

    sample = Path(__file__).parent / "asr/samples/why-is-the-sky-blue.wav"
    paths = [str(p) for p in (audio or [sample])]
    for path in paths:  # read once now: a bad file fails before two models load
        read_audio(path)
    quiet_libraries()
    with stderr.status("capturing activations and decoding in float16"):
        study = activations_study(
            load_model(asr_model),
            load_language_model(llm, pack=False),
            paths,
            list(DEFAULT_PROMPTS),
            max_new_tokens,
        )
    console = Console()
    console.print(report_table(study))
    console.print(
        "largest |x| entering a norm: "
        + ", ".join(f"{k} {v:g}" for k, v in study["largest"].items())
    )
    table = Table(title=f"{llm} in float16, greedy, vs float32 ({max_new_tokens} tokens)")
    for column in ("RMSNorm", "identical outputs", "agreeing prefix", "non-finite logits"):
        table.add_column(column)
    for variant, row in study["float16_decoding"].items():
        table.add_row(
            variant,
            f"{row['identical_outputs']}/{row['prompts']}",
            f"{row['mean_agreeing_prefix']:.0%}",
            str(row["nonfinite_prefill_logits"]),
        )
    show_report(table, study, json_path)
