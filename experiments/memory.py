"""``memory``: predicted vs published peak memory, and the framework estimators reproduced.

Two parts (issue 15 item 6):

1. Every row of ``shared/data/measured_runs.csv`` that reports a peak memory and that
   meshplan can express (``experiments.measured_rows``): the measured peak against the
   predicted lines the row's convention measures
   (``experiments.measured_runs.compared_memory``: torchtitan logs PyTorch's max reserved
   memory, i.e. the caching allocator's lines without the CUDA context and NCCL buffers),
   with the breakdown of the heaviest rank line by line (GiB).
2. The estimator figures of ``shared/reference/fidelity_notes.md`` ("Memory by
   precision"): Megatron-LM's ``report_theoretical_memory`` weights + optimizer for
   llama2-7b TP2 PP2 DP2 with SP (28,919 MiB; 19,280 MiB with the distributed optimizer)
   and DeepSpeed's ZeRO-2 / ZeRO-3 estimators for llama2-7b on 1 x 8 GPUs (26.67 / 14.61
   GiB), each as published, as the state model computes it from the framework's own
   parameter count (``framework_exact``: Megatron's formula unrounded), and as the Engine
   predicts it from the model it builds, with the difference in bytes named.

Outputs: ``memory.csv`` / ``.md`` (part 1), ``memory_estimators.csv`` / ``.md`` (part 2)
and ``memory.png`` (measured peak beside the stacked predicted lines per row).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.base import (
    ExperimentError,
    ExperimentResult,
    agg_pyplot,
    register_experiment,
    require,
    save_figure,
)
from experiments.tables import to_markdown

NAME = "memory"
TITLE = "Peak memory: predicted vs published, and the framework estimators"
GIB = 2**30
MIB = 2**20
#: the breakdown lines shown per row (``simulator.step_memory``), in order
LINES = ("params", "grads", "optimizer", "param_buffers", "activations", "recompute",
         "loss_temporaries", "op_workspace", "library_workspace", "fragmentation",
         "cuda_context", "nccl_buffers")


def megatron_most_loaded_shard(layers: int, hidden: int, ffn: int, vocab: int, tp: int,
                               pp: int) -> float:
    """Parameters of the most loaded model shard as Megatron-LM counts them
    (``megatron/training/theoretical_memory_usage.py``, NVIDIA+Megatron-LM d98e8a64, for a
    dense Llama: RMSNorm, SwiGLU, no GQA, untied embedding counted once on stage 0): the
    tp-sharded layer weights (q, k, v, o and the 3 SwiGLU projections) over pp plus the
    embedding, over tp, plus the replicated norms (two per layer and the final one) over
    pp."""
    sharded = layers * (2 * hidden * hidden * 2 + 2 * hidden * ffn * 3 / 2)
    replicated = layers * 2 * hidden + hidden
    return (sharded / pp + hidden * vocab) / tp + replicated / pp


def estimator_rows() -> pd.DataFrame:
    """Part 2: one row per estimator figure (published, state model on the framework's
    count, Engine), in the figure's unit (MiB for Megatron, GiB for DeepSpeed)."""
    engine_cls = require(NAME, "meshplan.engine", "Engine")
    strategy_cls = require(NAME, "meshplan.strategy", "Strategy")
    ms = require(NAME, "simulator.model_states")
    rows: list[dict[str, Any]] = []
    h, dp = 4096, 2
    shard = megatron_most_loaded_shard(32, h, 11008, 32000, 2, 2)
    for zero, per_param, published, label in ((0, 18, 28_919, "weights + optimizer"),
                                               (1, 6 + 12 / dp, 19_280, "with distributed optimizer")):
        s = strategy_cls(dp=dp, tp=2, pp=2, zero=zero, sequence_parallel=True, global_batch_size=8)
        res = engine_cls("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=4096,
                         layers_per_stage=[16, 16]).simulate()
        m = res.memory_per_stage[0]
        engine = m["params"] + m["grads"] + m["optimizer"]
        exact = ms.model_states("megatron", ms.StateInputs(params=int(shard), dp=dp, zero=zero)).total
        rows.append({"figure": f"Megatron-LM llama2-7b TP2 PP2 DP2 SP: {label}", "unit": "MiB",
                     "published": published, "framework_exact": exact / MIB, "engine": engine / MIB,
                     "engine_minus_framework_bytes": engine - exact,
                     "difference": (f"{per_param:g} B x -{h // 2} parameters: Megatron's most "
                                    f"loaded shard carries the final norm (h = {h}) / pp; the "
                                    f"norm lives on the last stage, not on stage 0")})
    p = 6_738_415_616
    for zero, published in ((2, 26.67), (3, 14.61)):
        s = strategy_cls(dp=8, zero=zero, framework="deepspeed", global_batch_size=8)
        b = engine_cls("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=4096).simulate().memory_breakdown
        engine = b["params"] + b["grads"] + b["optimizer"] + b["param_buffers"]
        exact = ms.model_states("deepspeed", ms.StateInputs(params=p, dp=8, zero=zero,
                                                            largest_param=32000 * 4096)).total
        rows.append({"figure": f"DeepSpeed ZeRO-{zero} estimator llama2-7b 1 x 8 GPUs", "unit": "GiB",
                     "published": published, "framework_exact": exact / GIB, "engine": engine / GIB,
                     "engine_minus_framework_bytes": engine - exact,
                     "difference": "none: the same P and largest layer (32000 x 4096 embedding)"})
    return pd.DataFrame.from_records(rows)


def row_table() -> pd.DataFrame:
    """Part 1: one line per expressible row with a measured peak."""
    rows_mod = require(NAME, "experiments.measured_rows")
    mr = require(NAME, "experiments.measured_runs")
    try:
        parsed = rows_mod.parse_all()
    except FileNotFoundError as e:
        raise ExperimentError(f"experiment {NAME!r}: {e}") from None
    recs = []
    for spec in parsed:
        if not spec.expressible or spec.peak_mem_bytes is None:
            continue
        pred = mr.predict(spec)
        got = mr.compared_memory(pred, spec.peak_mem_convention)
        b = pred.get("memory_breakdown") or {}
        rec = {"row_id": spec.row_id, "source": spec.source_id, "layout": spec.layout,
               "framework": spec.strategy.framework, "convention": spec.peak_mem_convention,
               "measured_GiB": spec.peak_mem_bytes / GIB, "predicted_GiB": got / GIB,
               "error_pct": 100 * (got / spec.peak_mem_bytes - 1) if not math.isnan(got) else math.nan,
               "total_GiB": b.get("total", math.nan) / GIB, "status": pred["status"]}
        rec.update({f"{k}_GiB": b.get(k, 0) / GIB for k in LINES})
        recs.append(rec)
    return pd.DataFrame.from_records(recs)


def plot(df: pd.DataFrame, path: Path) -> Path:
    """Per row: the measured peak (black tick) beside the stacked predicted lines."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(df))
    bottom = [0.0] * len(df)
    colors = plt.get_cmap("tab20").colors
    for i, k in enumerate(LINES):
        vals = df[f"{k}_GiB"].fillna(0).tolist()
        if not any(vals):
            continue
        ax.bar(x, vals, bottom=bottom, label=k, width=0.6, color=colors[i % len(colors)])
        bottom = [a + v for a, v in zip(bottom, vals, strict=True)]
    ax.scatter(list(x), df["measured_GiB"], marker="_", s=900, color="black", zorder=5,
               label="measured")
    ax.set_xticks(list(x), [f"row {r}\n{f}" for r, f in zip(df["row_id"], df["framework"], strict=True)],
                  fontsize=8)
    ax.set_ylabel("GiB per GPU (heaviest rank)")
    ax.set_title("peak memory: predicted lines vs measured")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return save_figure(fig, path)


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Both parts (quick and full are the same: four rows and four figures)."""
    df = row_table()
    if df.empty:
        raise ExperimentError(f"experiment {NAME!r}: no expressible row reports a peak memory")
    est = estimator_rows()
    out = Path(out_dir)
    est_path = out / f"{NAME}_estimators.csv"
    est.to_csv(est_path, index=False)
    est_path.with_suffix(".md").write_text(f"# {TITLE}: estimators\n\n{to_markdown(est, '.2f')}\n")
    fig = plot(df, out / f"{NAME}.png")
    ok = df[df["status"] == "ok"]
    notes = [f"Peak memory on {len(ok)} rows ({', '.join(sorted(set(ok['convention'])))}): "
             f"MAPE {ok['error_pct'].abs().mean():.1f} %, signed {ok['error_pct'].mean():+.1f} %, "
             f"worst row {int(ok.loc[ok['error_pct'].abs().idxmax(), 'row_id'])} "
             f"({ok['error_pct'].abs().max():.1f} %)."]
    notes += [f"{r.figure}: published {r.published:,.2f} {r.unit}; the state model on the "
              f"framework's own parameter count {r.framework_exact:,.2f}; the Engine "
              f"{r.engine:,.2f} ({r.engine_minus_framework_bytes:+,d} bytes: {r.difference})."
              for r in est.itertuples()]
    notes.append(
        "Before issue 15 these rows were under-predicted by 27 % on average: the Engine "
        "counted the program's bf16 softmax for the loss where torchtitan's "
        "F.cross_entropy(pred.float()) keeps an fp32 log-softmax and holds two more fp32 "
        "copies of the logits in its backward (15.7 GiB for 16384 tokens x 128256 vocab), "
        "no FSDP unsharded buffers (root embedding + head, two blocks in flight, the head's "
        "and one block's unsharded gradients: 5.0 GiB for Llama 3.1 8B), no allocator "
        "fragmentation and no library workspace.")
    notes.append(
        "The torch.compile rows (61, 68) measure 5.4 and 5.0 GiB below their eager twins "
        "(60, 67); the Engine predicts the same activations for both (compiled blocks "
        "saving less under op-level SAC is not modelled), so they come out over-predicted.")
    desc = ("Part 1: rows of `shared/data/measured_runs.csv` with `peak_mem_gb`, predicted by "
            "`Engine(...).simulate()` under the row's framework profile; `predicted_GiB` is "
            "the part of the breakdown the row's convention measures (torch max reserved: "
            "the allocator lines, no CUDA context or NCCL buffers); the breakdown columns are "
            "the heaviest rank's lines. Part 2 (`memory_estimators.md`): the Megatron-LM and "
            "DeepSpeed estimator figures of `shared/reference/fidelity_notes.md`.")
    return ExperimentResult(NAME, TITLE, df, desc, notes, figures=[fig], float_format=".2f")
