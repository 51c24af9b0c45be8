"""``meshplan cost``: predicted step time, throughput, MFU and memory of one strategy.

Prints the framework profile, attention implementation and sequence length it costed
with, the time breakdown of the critical rank (compute, TP comm, PP comm, bubble, DP
sync, optimizer) and the memory breakdown of the heaviest rank; ``--json`` prints
step_time_ms, tokens_per_s, tflops_per_gpu, mfu, max_memory_bytes, the breakdowns and
``framework``, ``attention``, ``attention_kernel``, ``seq_len``."""

from __future__ import annotations

import json

import typer

from meshplan.commands import options as opt


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _memory_fit(res: object, capacity: int) -> dict[str, object]:
    """``device_memory_bytes`` and ``fits_in_memory`` (peak of the heaviest rank against
    the device's memory) for the report."""
    peak = int(res.max_memory_bytes)  # type: ignore[attr-defined]
    return {"device_memory_bytes": capacity, "fits_in_memory": peak <= capacity}


def software(engine: object) -> dict[str, object]:
    """What the Engine costed with besides the layout: ``framework`` (profile name),
    ``attention`` (flash / unfused, resolved), ``attention_kernel`` (the profile's flash
    kernel, None for unfused attention) and ``seq_len`` (tokens per sequence) and ``fp8``
    (the FP8 recipe, None for none)."""
    s = engine.strategy  # type: ignore[attr-defined]
    kernel = engine.profile.kernels.attention_kernel.value  # type: ignore[attr-defined]
    return {"framework": s.framework, "attention": s.attention,
            "attention_kernel": kernel if s.attention == "flash" else None,
            "seq_len": engine.source.seq_len, "fp8": s.fp8}  # type: ignore[attr-defined]


def _render(model: str, cluster: str, res: object, capacity: int, sw: dict[str, object]) -> str:
    d = res.to_dict()  # type: ignore[attr-defined]
    kernel = f" ({sw['attention_kernel']})" if sw["attention_kernel"] else ""
    lines = [
        f"{model} on {cluster}: step {d['step_time_ms']:.2f} ms, {d['tokens_per_s']:.0f} tokens/s, "
        f"{d['tflops_per_gpu']:.1f} TFLOP/s per GPU, MFU {d['mfu'] * 100:.1f}%, "
        f"bubble ratio {d['bubble_ratio']:.4f}",
        f"framework {sw['framework']}, attention {sw['attention']}{kernel}, "
        f"seq len {sw['seq_len']}" + (f", fp8 {sw['fp8']} (decoder linears)" if sw.get("fp8") else ""),
        f"layers per stage: {d['layers_per_vstage']}",
        "time breakdown (critical rank):",
    ]
    lines += [f"  {k:<10} {v * 1e3:10.2f} ms" for k, v in d["time_breakdown_s"].items()]
    lines.append(f"memory breakdown (heaviest rank), max {_fmt_bytes(d['max_memory_bytes'])}:")
    lines += [f"  {k:<12} {_fmt_bytes(v):>12}" for k, v in d["memory_breakdown_bytes"].items()]
    if d["max_memory_bytes"] > capacity:
        lines.append(f"OUT OF MEMORY: the heaviest rank needs {_fmt_bytes(d['max_memory_bytes'])}, "
                     f"the device has {_fmt_bytes(capacity)}")
    return "\n".join(lines)


def cost_cmd(
    ctx: typer.Context,
    model: str = opt.MODEL,
    cluster: str = opt.CLUSTER,
    nodes: int | None = opt.NODES,
    dp: int = opt.DP,
    tp: int = opt.TP,
    pp: int = opt.PP,
    vpp: int = opt.VPP,
    schedule: opt.Schedule = opt.SCHEDULE,
    micro_batch_size: int = opt.MICRO_BATCH_SIZE,
    global_batch: int = opt.GLOBAL_BATCH,
    seq_len: int | None = opt.SEQ_LEN,
    recompute: opt.Recompute = opt.RECOMPUTE,
    zero: int = opt.ZERO,
    sequence_parallel: bool = opt.SEQUENCE_PARALLEL,
    dtype: opt.Dtype = opt.DTYPE,
    framework: opt.Framework = opt.FRAMEWORK,
    attention: opt.Attention | None = opt.ATTENTION,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    trace: str | None = typer.Option(None, "--trace", help="Write the pipeline timeline as Chrome trace JSON."),
) -> None:
    """Cost one training step of MODEL on CLUSTER under a strategy."""
    from meshplan.engine import Engine

    strategy = opt.build_strategy(ctx, dp=dp, tp=tp, pp=pp, vpp=vpp, schedule=schedule,
                                  micro_batch_size=micro_batch_size, global_batch_size=global_batch,
                                  recompute=recompute, zero=zero,
                                  sequence_parallel=sequence_parallel, dtype=dtype,
                                  framework=framework, attention=attention)
    engine = Engine(model, cluster, strategy, nodes=nodes, seq_len=seq_len)
    res = engine.simulate()
    capacity = int(engine.cluster.device.memory_bytes.value)
    if trace is not None:
        res.sim.to_chrome_trace(trace)
    if as_json:
        typer.echo(json.dumps({**res.to_dict(), **_memory_fit(res, capacity), **software(engine)},
                              sort_keys=True))
    else:
        typer.echo(_render(model, cluster, res, capacity, software(engine)))


def register(app: typer.Typer) -> None:
    """Add the ``cost`` command to ``app``."""
    app.command("cost", cls=opt.StrategyCommand)(cost_cmd)
