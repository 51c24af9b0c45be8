"""``meshplan program show --model NAME [--layers L] [--batch-size B] [--seq-len S]``:
build a model's forward program and print it as PIR text plus a summary (ops by type,
parameter count).

``NAME`` is a built-in model (``llama2-7b``, ``gpt3-175b``, ``megatron-1t`` ...) or a path to
a Hugging Face style ``config.json``. An unknown name raises ``ModelConfigError`` (a
``ValueError``); ``meshplan.cli.main`` prints it as one ``error: ...`` line, exit code 2."""

from __future__ import annotations

from collections import Counter
from typing import Any

import typer

from meshplan.commands import options as opt


def _features(cfg: Any) -> str:
    """What else sets an architecture apart, as ``, ...`` (empty when nothing does): grouped
    KV heads, qk-norm, a sliding window, mixture-of-experts routing."""
    parts = []
    if cfg.num_kv_heads != cfg.num_heads:
        parts.append(f"GQA {cfg.num_heads}/{cfg.num_kv_heads} heads")
    if cfg.qk_norm:
        parts.append("qk-norm")
    if cfg.sliding_window is not None:
        windowed = sum(cfg.window_of(i) is not None for i in range(cfg.num_layers))
        where = "" if windowed == cfg.num_layers else f" on {windowed} of {cfg.num_layers} layers"
        parts.append(f"sliding window {cfg.sliding_window}{where}")
    if getattr(cfg, "num_experts", None):
        parts.append(f"MoE {cfg.num_experts} experts top-{cfg.experts_per_token}")
    return "".join(f", {p}" for p in parts)


def summary_lines(program: Any, title: str) -> list[str]:
    """The summary block of a ``completion.ir.Program``: op count by role, ops by type (most
    frequent first), parameters."""
    from completion.ir import OpRole

    by_type = Counter(op.full_type for op in program.ops)
    by_role = Counter(OpRole(op.role).name.lower() for op in program.ops)
    n_params = program.num_parameters()
    roles = ", ".join(f"{r} {n}" for r, n in sorted(by_role.items()))
    lines = [f"// summary: {title}", f"// ops: {len(program.ops)} ({roles})"]
    width = max((len(t) for t in by_type), default=0)
    for t, n in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"//   {t:<{width}}  {n}")
    size = f"{n_params / 1e9:.3f} B" if n_params >= 1e8 else f"{n_params / 1e6:.3f} M"
    lines.append(f"// parameters: {n_params:,} ({size})")
    return lines


def show_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Built-in model name or config.json path."),
    layers: int | None = opt.LAYERS,
    batch_size: int = typer.Option(1, "--batch-size", "-b", max=opt.MAX_BATCH,
                                   help="Sequences per step."),
    seq_len: int | None = opt.SEQ_LEN,
    dtype: str = typer.Option("bfloat16", "--dtype", help="float32, bfloat16 or float16."),
    summary_only: bool = typer.Option(False, "--summary-only", help="Print only the summary."),
) -> None:
    """Print the forward program of MODEL as PIR text, then a summary."""
    from completion.models import build_model, get_model_config
    from completion.pir import print_program

    cfg = get_model_config(model)
    program = build_model(cfg, batch_size, seq_len, dtype=dtype, num_layers=layers)
    if layers is not None:  # the summary describes the layers built
        cfg = cfg.replace(num_layers=layers)
    if not summary_only:
        typer.echo(print_program(program).rstrip("\n"))
    n_layers = layers if layers is not None else cfg.num_layers
    s = seq_len if seq_len is not None else cfg.seq_len
    # the builder family and what sets the architecture apart (a Gemma or Qwen config.json
    # builds through the llama family: the family alone would name it "llama")
    arch = (f"{cfg.family} builder: {cfg.resolved_norm} {cfg.norm_placement}, {cfg.mlp_activation}, "
            f"{cfg.resolved_positions} positions{_features(cfg)}")
    title = f"{cfg.name} ({arch}), {n_layers} layers, batch {batch_size}, seq {s}, {dtype}"
    typer.echo("\n".join(summary_lines(program, title)))


def register(app: typer.Typer) -> None:
    """Attach the ``program`` command group (show) to ``app``."""
    group = typer.Typer(help="Build and inspect programs.", no_args_is_help=True)
    group.command("show")(show_cmd)
    app.add_typer(group, name="program")
