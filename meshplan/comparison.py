"""Several plans of one model and cluster side by side (``meshplan compare``): the plans as
the cross product of knob lists (:func:`plans`), one result row per plan (:func:`row`), the
statistical ties with the best plan (:func:`mark_ties`, ``simulator.error_band``) and the
table with its notes (:func:`table`, :func:`echo_table`). The command's comma-list
options: ``meshplan.commands.compare``.
"""

from __future__ import annotations

import itertools
import textwrap
from typing import Any

from meshplan import terminal
from meshplan.terminal import echo

#: column heads of the knobs in the table
HEADS = {"dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "vpp": "vpp", "micro_batch_size": "mbs",
         "global_batch_size": "gbs", "zero": "ZeRO", "schedule": "schedule",
         "recompute": "recompute", "cp_comm": "cp comm", "dtype": "dtype",
         "framework": "framework", "attention": "attention", "moe_capacity_factor": "capacity",
         "moe_load_imbalance": "imbalance", "layers_per_stage": "split", "fsdp_shard_size": "HSDP"}


def plans(lists: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cross product of ``lists`` as knob dicts, first field varying slowest."""
    fields = list(lists)
    return [dict(zip(fields, combo, strict=True)) for combo in itertools.product(*lists.values())]


def label(knobs: dict[str, Any], varied: list[str]) -> str:
    """``schedule=VPP tp=8``: the knobs that differ between the plans (``plan`` for one)."""
    return " ".join(f"{HEADS[f]}={knobs[f]}" for f in varied) or "plan"


#: the result keys of a costed row (null in a refused one, which has ``error``)
RESULT_KEYS = ("gpus", "gpus_available", "step_time_ms", "tokens_per_s", "mfu", "mfu_causal",
               "bubble_ratio",
               "max_memory_bytes", "layers_per_vstage", "memory_limit_bytes", "fits_in_memory")


def row(knobs: dict[str, Any], res: Any, fit: dict[str, Any], gpus: int = 0,
         available: int = 0) -> dict[str, Any]:
    d = res.to_dict()
    return {**knobs, "gpus": gpus, "gpus_available": available,
            "step_time_ms": d["step_time_ms"], "tokens_per_s": d["tokens_per_s"],
            "mfu": d["mfu"], "mfu_causal": d["mfu_causal"], "bubble_ratio": d["bubble_ratio"],
            "max_memory_bytes": d["max_memory_bytes"], "layers_per_vstage": d["layers_per_vstage"],
            "memory_limit_bytes": fit["memory_limit_bytes"],
            "fits_in_memory": fit["fits_in_memory"], "error": None}


def mark_ties(rows: list[dict[str, Any]]) -> None:
    """Give each costed row ``step_time_band`` (its error band, ``simulator.error_band``) and
    ``tied_with_best``: whether its band overlaps the band of the best plan (the fastest
    that fits in memory, else the fastest) -- statistically tied with it (the best plan
    itself: True). Refused rows get None for both. Replaces each row's ``band`` (a Band)."""
    from simulator.error_band import tied

    ok = [r for r in rows if r["error"] is None]
    fitting = [r for r in ok if r["fits_in_memory"]] or ok
    best = min(fitting, key=lambda r: r["step_time_ms"]) if fitting else None
    for r in rows:
        b = r.pop("band", None)
        if r["error"] is not None or b is None or best is None:
            r["step_time_band"], r["tied_with_best"] = None, None
            continue
        r["step_time_band"] = b.to_dict(r["step_time_ms"] / 1e3)
        r["_band"] = b
    for r in ok:
        r["tied_with_best"] = tied((r["step_time_ms"] / 1e3, r["_band"]),
                                   (best["step_time_ms"] / 1e3, best["_band"]))  # type: ignore[index]
    for r in ok:
        del r["_band"]


def table(rows: list[dict[str, Any]], varied: list[str], title: str, gpus: bool = False) -> Any:
    """A rich Table of the compared plans: the varied knobs, then step ms, tokens/s, MFU,
    bubble, peak GiB, fits (``*``: statistically tied with the best plan, :func:`mark_ties`;
    a refused plan: ``refused`` and the number ``[i]`` of its
    reason, which the command prints under the table); ``gpus``: a GPUs column (when the
    plans use different GPU counts)."""
    from rich.table import Table

    tab = Table(title=title)
    for f in varied:
        tab.add_column(HEADS[f])
    for col in (("GPUs",) if gpus else ()) + ("step ms", "tokens/s", "MFU", "bubble", "peak GiB", "fits"):
        tab.add_column(col, justify="right")
    refused = 0
    for r in rows:
        knobs = [_cell(r, f) for f in varied]
        if r["error"] is not None:
            refused += 1
            tab.add_row(*knobs, *([""] if gpus else []), "refused", "", "", "", "", f"[{refused}]")
            continue
        tab.add_row(*knobs, *([str(r["gpus"])] if gpus else []),
                    f"{r['step_time_ms']:.2f}", f"{r['tokens_per_s']:.0f}",
                    f"{r['mfu'] * 100:.1f}%", f"{r['bubble_ratio']:.3f}",
                    f"{r['max_memory_bytes'] / 2**30:.1f}",
                    ("yes" if r["fits_in_memory"] else "NO") + ("*" if r.get("tied_with_best") else ""))
    return tab


def _cell(row: dict[str, Any], field: str) -> str:
    """A knob's table cell; a split word also shows the split costed (``even [4, 4]``)."""
    if field == "layers_per_stage" and row.get("layers_per_vstage") is not None:
        return f"{row[field]} {row['layers_per_vstage']}"
    return str(row[field])


def echo_table(rows: list[dict[str, Any]], varied: list[str], title: str) -> None:
    """Print the compared plans' table (:func:`table`), the MFU convention
    (``simulator.step.MFU_NOTE``), a note when they use different or
    fewer GPUs than the cluster has, and each refused plan's reason ``[i]``."""

    used = sorted({r["gpus"] for r in rows if r["error"] is None})
    avail = next(r["gpus_available"] for r in rows if r["error"] is None)
    echo(terminal.render(table(rows, varied, title, gpus=len(used) > 1)))
    from simulator.step import MFU_NOTE

    echo(textwrap.fill(MFU_NOTE, terminal.width()))
    if sum(bool(r.get("tied_with_best")) for r in rows) > 1:
        echo(textwrap.fill(
            "* statistically tied with the best plan (the fastest that fits): their error bands "
            "overlap (where 80% of comparable measured runs fell, simulator.error_band; --json: "
            "step_time_band, tied_with_best)",
            terminal.width()))
    if len(used) > 1 or used[0] < avail:
        echo(textwrap.fill(
            f"note: the plans use {', '.join(map(str, used))} of the {avail} GPUs; tokens/s is "
            f"per plan, not per GPU (cost shows which GPUs a plan leaves idle)", terminal.width()))
    reasons = [r["error"] for r in rows if r["error"] is not None]
    for i, why in enumerate(reasons, 1):
        echo(textwrap.fill(f"[{i}] {why}", terminal.width(), subsequent_indent="    "))
