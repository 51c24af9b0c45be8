"""What ``meshplan cost`` says of one costed plan: the device's memory against the plan's
peak (:func:`memory_fit`), what the Engine costed with besides the layout
(:func:`software`), the layout as costed (:func:`layout`, :func:`layout_line`), the error
band line (:func:`band_line`) and the whole text report (:func:`render`: the time and
memory breakdowns with what each term means, :data:`TIME_TERMS`). The command:
``meshplan.commands.cost``.
"""

from __future__ import annotations

from typing import Any


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def memory_fit(res: object, device: object, headroom: float) -> dict[str, object]:
    """The device's memory against the plan's peak (heaviest rank), bytes:
    ``device_memory_bytes`` (capacity), ``reserved_memory_bytes`` (driver), ``usable_memory_bytes``
    (capacity - reserve), ``memory_headroom`` (fraction) and ``memory_headroom_bytes``,
    ``memory_limit_bytes`` = usable - headroom bytes, ``fits_in_memory`` = peak <= limit
    (``clusters.spec.DeviceSpec.memory_limit``)."""
    peak = int(res.max_memory_bytes)  # type: ignore[attr-defined]
    usable = float(device.usable_bytes)  # type: ignore[attr-defined]
    limit = float(device.memory_limit(headroom))  # type: ignore[attr-defined]
    return {"device_memory_bytes": int(device.memory_bytes.value),  # type: ignore[attr-defined]
            "reserved_memory_bytes": int(device.reserved_bytes),  # type: ignore[attr-defined]
            "usable_memory_bytes": int(usable), "memory_headroom": float(headroom),
            "memory_headroom_bytes": int(usable - limit), "memory_limit_bytes": int(limit),
            "fits_in_memory": peak <= limit}


def software(engine: object) -> dict[str, object]:
    """What the Engine costed with besides the layout: ``framework`` (profile name),
    ``attention`` (flash / unfused, resolved), ``attention_kernel`` (the profile's flash
    kernel, None for unfused attention) and ``seq_len`` (tokens per sequence) and ``fp8``
    (the FP8 recipe, None for none) and ``fsdp_shard_size`` (the HSDP shard group, None for
    none)."""
    s = engine.strategy  # type: ignore[attr-defined]
    kernel = engine.profile.kernels.attention_kernel.value  # type: ignore[attr-defined]
    return {"framework": s.framework, "attention": s.attention,
            "attention_kernel": kernel if s.attention == "flash" else None,
            "seq_len": engine.source.seq_len, "fp8": s.fp8,  # type: ignore[attr-defined]
            "fsdp_shard_size": s.fsdp_shard_size}


#: time-breakdown key -> what its line means (the critical rank's step, seconds)
TIME_TERMS = {
    "compute": "kernels of its stages (forward, backward, recompute), and the host's dispatch where it is slower",
    "tp_comm": "collectives inside its stages (TP, CP, EP all_to_all, ZeRO-3 gathers and reduces), all issued",
    "overlapped": "of tp_comm, the part that ran beside compute (not on the critical path)",
    "pp_comm": "the p2p hops it sends to other pipeline stages (synchronous sends: busy time; "
               "asynchronous: a delay inside the bubble)",
    "bubble": "idle: waiting for its pipeline neighbours (warm-up, cool-down, stalls)",
    "dp_sync": "gradient reduce and parameter gathers not hidden behind the backward",
    "optimizer": "optimizer step and once-per-step kernels",
}


#: the layout fields ``cost`` reports, in Megatron's short names (``layout`` in --json)
LAYOUT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "schedule", "micro_batch_size",
                 "global_batch_size", "recompute", "zero", "sequence_parallel")


def layout(strategy: object) -> dict[str, object]:
    """The strategy's layout as costed (after the Megatron arguments were translated, e.g.
    ``--num-layers-per-virtual-pipeline-stage`` into vpp): :data:`LAYOUT_FIELDS` (``etp``
    only when the plan states it: None is tp)."""
    return {k: getattr(strategy, k) for k in LAYOUT_FIELDS if k != "etp" or getattr(strategy, k) is not None}


def layout_line(lay: dict[str, object]) -> str:
    """``plan: dp=4 tp=4 pp=2 cp=1 vpp=2 VPP, mbs 1, gbs 64, recompute full, zero 1, sp off``
    (``ep=N`` after cp when expert parallelism is on)."""
    ep = f"ep={lay['ep']} " if lay.get("ep", 1) != 1 else ""
    if lay.get("etp") is not None and lay.get("etp") != lay.get("tp"):
        ep += f"etp={lay['etp']} "
    return (f"plan: dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} cp={lay['cp']} {ep}vpp={lay['vpp']} "
            f"{lay['schedule']}, mbs {lay['micro_batch_size']}, gbs {lay['global_batch_size']}, "
            f"recompute {lay['recompute']}, zero {lay['zero']}, "
            f"sp {'on' if lay['sequence_parallel'] else 'off'}")


def band_line(b: dict[str, Any]) -> str:
    """One line of a prediction's error band (``simulator.error_band``: ``Band.to_dict``)."""
    return (f"error band: {b['low_ms']:.2f} - {b['high_ms']:.2f} ms ({b['coverage']:.0%} of "
            f"{b['comparable_runs']} comparable measured runs, grouped by {b['basis']}, measured "
            f"within it; simulator.error_band)")


def render(model: str, cluster: str, res: object, fit: dict[str, object], sw: dict[str, object],
            inputs: dict[str, object], lay: dict[str, object], band: dict[str, Any]) -> str:
    from meshplan.cost_inputs import input_lines

    d = res.to_dict()  # type: ignore[attr-defined]
    lines = [
        f"{model} on {cluster}: step {d['step_time_ms']:.2f} ms, {d['tokens_per_s']:.0f} tokens/s, "
        f"{flop_rate(d['tflops_per_gpu'] * 1e12)} per GPU, MFU {d['mfu'] * 100:.1f}%"
        + (f" of the FP8 peak ({d['mfu_bf16'] * 100:.1f}% of the BF16 peak, as NeMo and "
           f"torchtitan report it)" if abs(d["mfu_bf16"] - d["mfu"]) > 1e-12 else "")
        + f" (causal attention counted in full, as Megatron-LM does; {d['mfu_causal'] * 100:.1f}% "
        f"counting it as executed)"
        + ("" if fit["fits_in_memory"] else
           f" -- OUT OF MEMORY ({_fmt_bytes(d['max_memory_bytes'])} of a "
           f"{_fmt_bytes(fit['memory_limit_bytes'])} limit)"),
        band_line(band),
        layout_line(lay),
        f"pipeline bubble: ZB bubble rate {d['zb_bubble_rate']:.4f} (Qi et al. 2024 sec. 5.3: "
        f"(largest rank span - largest rank busy time) / largest rank span); critical rank idle "
        f"{d['critical_rank_idle_fraction']:.4f} of the step (its bubble line / step time)",
        *input_lines(inputs, sw["attention_kernel"]),  # type: ignore[arg-type]
        *([f"HSDP: ZeRO-3 in shard groups of {sw['fsdp_shard_size']} dp ranks, replicated "
           f"{inputs['strategy']['dp'] // sw['fsdp_shard_size']} times"] if sw.get("fsdp_shard_size") else []),
        f"layers per stage: {d['layers_per_vstage']}",
        "time breakdown (critical rank: the pipeline rank that finishes last; compute + tp_comm "
        "- overlapped + bubble + dp_sync + optimizer, + pp_comm when sends are synchronous, "
        "= the step):",
    ]
    lines += [f"  {k:<10} {v * 1e3:10.2f} ms  {TIME_TERMS.get(k, '')}".rstrip()
              for k, v in d["time_breakdown_s"].items()]
    lines.append(f"memory breakdown (heaviest rank), max {_fmt_bytes(d['max_memory_bytes'])}:")
    lines += [f"  {k:<18} {_fmt_bytes(v):>12}" for k, v in d["memory_breakdown_bytes"].items()]
    lines.append(f"device memory {_fmt_bytes(fit['device_memory_bytes'])} - driver reserve "
                 f"{_fmt_bytes(fit['reserved_memory_bytes'])} = usable "
                 f"{_fmt_bytes(fit['usable_memory_bytes'])}; headroom "
                 f"{fit['memory_headroom']:.0%} ({_fmt_bytes(fit['memory_headroom_bytes'])}): "
                 f"limit {_fmt_bytes(fit['memory_limit_bytes'])}")
    if not fit["fits_in_memory"]:
        lines.append(f"OUT OF MEMORY: the heaviest rank needs {_fmt_bytes(d['max_memory_bytes'])}, "
                     f"usable memory less headroom is {_fmt_bytes(fit['memory_limit_bytes'])}")
    return "\n".join(lines)


def flop_rate(flops_per_s: float) -> str:
    """``412.9 TFLOP/s``, or in GFLOP/s below one TFLOP/s (a CPU rank: 28.3 GFLOP/s, which
    TFLOP/s printed as 0.0 beside a 42% MFU)."""
    if flops_per_s >= 1e12 or flops_per_s == 0:
        return f"{flops_per_s / 1e12:.1f} TFLOP/s"
    return f"{flops_per_s / 1e9:.1f} GFLOP/s"
