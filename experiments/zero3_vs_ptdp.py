"""``zero3_vs_ptdp``: Narayanan et al. (SC21) Table 2 -- GPT-3 175B on 384-1,536 A100 of
Selene at a fixed global batch of 1,536 -- predicted: DeepSpeed ZeRO-3 without model
parallelism (the ``deepspeed-2021`` profile: DeepSpeed 8b8ed2a7d of April 2021) against
Megatron-LM's PTD-P (tp 8 x pp 12, the ``megatron-2021`` profile). Measured step time =
the paper's eq. 3 FLOPs / (teraFLOP/s per GPU x GPUs), as ``experiments.measured_rows``
derives Table 1's. ZeRO-3 measured 1.06x, 1.69x and 3.2x slower than PTD-P; its step time
stops falling beyond 768 GPUs (66.75 s at 768 and at 1,536) while PTD-P's halves.

Each run is built from Table 1's 145.6B row (``measured_runs.csv`` row 21: the same
Selene, fp16, full recompute, Megatron GPT architecture) with the layer count, layout,
micro-batch and batch of ``experiments/data/narayanan2021_table2.csv``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from experiments.base import ExperimentResult, register_experiment, require

NAME = "zero3_vs_ptdp"
TITLE = "ZeRO-3 vs PTD-P, GPT-3 175B on 384-1,536 A100 (Narayanan et al. SC21, Table 2)"
DATA = Path(__file__).resolve().parent / "data" / "narayanan2021_table2.csv"
TEMPLATE_ROW = 21
PROFILES = {"zero3": "deepspeed-2021", "ptdp": "megatron-2021"}


def eq3_flops(r: pd.Series) -> float:
    """Narayanan et al. eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16 l h) (with recompute)."""
    b, s, layers, h, v = r.global_batch, r.seq_len, r.n_layers, r.hidden, r.vocab
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def spec_of(r: pd.Series) -> object:
    """The RunSpec of one Table 2 line: row 21's cells with this line's layers, layout,
    micro-batch and batch; ZeRO-3 lines get ZeRO stage 3 and the ``deepspeed-2021``
    profile. Raises ExperimentError when the row does not parse."""
    rows = require(NAME, "experiments.measured_rows")
    base = next(x for x in rows.load_rows() if x["row_id"] == str(TEMPLATE_ROW))
    row = dict(base)
    row.update(row_id="9000", model_name=f"Megatron GPT {r.params_b}B", n_layers=str(r.n_layers),
               num_gpus=str(r.gpus), tp=str(r.tp), pp=str(r.pp), vpp="1", dp=str(r.dp),
               micro_batch_size=str(r.micro_batch), global_batch_seqs=str(r.global_batch),
               global_batch_tokens=str(r.global_batch * r.seq_len), tflops_per_gpu=str(r.tflops_per_gpu),
               derived_step_time_s=f"{eq3_flops(r) / (r.tflops_per_gpu * 1e12 * r.gpus):.3f}")
    spec = rows.parse_row(row)
    zero = 3 if r.scheme == "zero3" else spec.strategy.zero
    strategy = dataclasses.replace(spec.strategy, zero=zero, framework=PROFILES[r.scheme])
    return dataclasses.replace(spec, strategy=strategy)


def predict(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``measured_s``, ``predicted_s`` and ``error_pct`` per line."""
    engine = require(NAME, "meshplan.engine", "Engine")
    out = []
    for r in table.itertuples(index=False):
        s = pd.Series(r._asdict())
        spec = spec_of(s)
        res = engine(spec.model, spec.cluster, spec.strategy, nodes=spec.nodes, seq_len=spec.seq_len).simulate()
        meas = eq3_flops(s) / (r.tflops_per_gpu * 1e12 * r.gpus)
        out.append({**r._asdict(), "profile": PROFILES[r.scheme], "measured_s": meas,
                    "predicted_s": res.step_time, "error_pct": 100 * (res.step_time / meas - 1)})
    return pd.DataFrame(out)


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per GPU count: ZeRO-3 / PTD-P step time, measured and predicted, and whether the
    model orders the two as measured."""
    z = df[df.scheme == "zero3"].set_index("gpus")
    p = df[df.scheme == "ptdp"].set_index("gpus")
    out = pd.DataFrame({"measured_ratio": z.measured_s / p.measured_s,
                        "predicted_ratio": z.predicted_s / p.predicted_s})
    out["ordered"] = (out.measured_ratio > 1) == (out.predicted_ratio > 1)
    return out.reset_index()


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Predict the six Table 2 lines (``quick``: the same six; they take seconds)."""
    del quick, out_dir
    df = predict(pd.read_csv(DATA))
    rat = ratios(df)
    notes = [f"{int(r.gpus)} GPUs: ZeRO-3 / PTD-P measured {r.measured_ratio:.2f}x, predicted "
             f"{r.predicted_ratio:.2f}x ({'same order' if r.ordered else 'ORDER WRONG'})" for r in rat.itertuples()]
    cols = ["scheme", "gpus", "tp", "pp", "dp", "micro_batch", "profile", "measured_s", "predicted_s", "error_pct"]
    return ExperimentResult(NAME, TITLE, df[cols], __doc__ or "", notes, float_format=".2f")
