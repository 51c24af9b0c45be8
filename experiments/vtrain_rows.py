"""The rows of ``shared/data/vtrain_single_node.csv``, stated as a user states them to
``meshplan cost``.

``shared/reference/measured_runs.md`` ("A second development set") documents the file:
1,440 iteration times (ms) from vTrain's released ground truth (Bang et al., MICRO 2024;
github.com/VIA-Research/vTrain ``data/ground_truth_single.csv``) of GPT models on one A100
SXM node under Megatron-DeepSpeed. Columns: ``# GPUs``, ``global batch``, ``micro batch``,
``hidden size``, ``attention heads``, ``# layers``, ``sequence length``, ``tensor
parallelism``, ``data parallelism``, ``pipeline parallelism``, ``iteration time (ms)``.

Each row becomes (:func:`spec`) what a user types for it:

- the model as a GPT-2 ``config.json`` (:func:`hf_config`; ``completion.models.hf_config``,
  the loader ``cost --model config.json`` runs): the row's layers, hidden size and heads,
  the GPT-2 vocabulary (50,257), ``n_positions`` = the sequence, Megatron's default dropout
  0.1 (``--attention-dropout`` / ``--hidden-dropout``, microsoft/Megatron-DeepSpeed f4157bea
  ``megatron/arguments.py``; the source states none), ``attn_implementation: eager`` (the
  codebase's unfused attention; the source states no flash attention);
- the cluster ``dgx-a100-80g`` on one node (A100 SXM, NVLink 3; 80 GB assumed, the source
  states A100 SXM only);
- the strategy (``completion.strategy.Strategy``): the row's tp, pp, dp, micro and global
  batch, full activation recompute (``use_checkpoint: true`` in every config of the
  source), fp16 (the codebase's usual mixed precision; not stated), ZeRO-1 (Megatron-
  DeepSpeed's example scripts; not stated: with dp = 1 it shards nothing), the
  ``megatron-deepspeed`` framework profile, the layers split evenly over the stages
  (DeepSpeed ``PipelineModule(partition_method='type:transformer')`` in
  ``megatron/model/gpt_model.py`` GPTModelPipe balances the transformer layers; every
  row's layer count divides by its pp), 1F1B.

A row id is its 1-based line number among the data lines (row 1 is the first run).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.errors import InputFileNotFoundError
from completion.models.config import ModelConfig
from completion.models.hf_config import config_from_hf_dict
from completion.strategy import Strategy
from experiments.base import ExperimentError

#: the development set, beside the repository (``../shared/data/vtrain_single_node.csv``)
DATA_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "vtrain_single_node.csv"
#: catalog cluster of the rows (one A100 SXM node)
CLUSTER = "dgx-a100-80g"
#: framework profile the rows run under (simulator/profiles/catalog/megatron-deepspeed.yaml)
FRAMEWORK = "megatron-deepspeed"
#: GPT-2's vocabulary (vTrain ``src/config.py`` vocab_size default 50257)
VOCAB = 50257
#: Megatron's default dropout probabilities (Megatron-DeepSpeed f4157bea megatron/arguments.py)
DROPOUT = 0.1
#: the CSV's columns, in order
COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
           "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
           "iteration time (ms)")


@dataclass(frozen=True)
class VtrainRun:
    """One row of the CSV.

    Attributes:
        row_id: 1-based line number among the data lines.
        gpus, global_batch, micro_batch, hidden, heads, layers, seq, tp, dp, pp: the row.
        measured_ms: the iteration time (ms).
    """

    row_id: int
    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq: int
    tp: int
    dp: int
    pp: int
    measured_ms: float

    @property
    def layout(self) -> str:
        """``tp2 pp2 dp2 mbs4``."""
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mbs{self.micro_batch}"

    @property
    def tokens_per_step(self) -> int:
        """Global batch x sequence."""
        return self.global_batch * self.seq


def load(path: str | Path | None = None) -> list[VtrainRun]:
    """The rows of the CSV (default :data:`DATA_CSV`). Raises FileNotFoundError naming the
    path when it is absent and ExperimentError naming the line for a row that does not
    read (a column missing, a cell not a number, tp x pp x dp != GPUs)."""
    p = Path(path) if path is not None else DATA_CSV
    if not p.is_file():
        raise InputFileNotFoundError(f"vTrain rows file not found: {p}")
    out = []
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader, [])]
        if tuple(header) != COLUMNS:
            raise ExperimentError(f"{p}: header {header} is not {list(COLUMNS)}")
        for i, cells in enumerate(reader, start=1):
            if not cells:
                continue
            try:
                *ints, ms = cells
                vals = [int(c) for c in ints]
                run = VtrainRun(i, *vals, float(ms))  # type: ignore[arg-type]
            except (TypeError, ValueError) as e:
                raise ExperimentError(f"{p}: data line {i}: {cells!r} does not read ({e})") from None
            if run.tp * run.pp * run.dp != run.gpus:
                raise ExperimentError(f"{p}: data line {i}: tp x pp x dp = "
                                      f"{run.tp * run.pp * run.dp} != {run.gpus} GPUs")
            out.append(run)
    return out


def hf_config(run: VtrainRun) -> dict[str, Any]:
    """The GPT-2 ``config.json`` of a row's model (module docstring)."""
    return {"model_type": "gpt2", "n_layer": run.layers, "n_embd": run.hidden, "n_head": run.heads,
            "vocab_size": VOCAB, "n_positions": run.seq, "activation_function": "gelu",
            "attn_pdrop": DROPOUT, "resid_pdrop": DROPOUT, "embd_pdrop": DROPOUT,
            "attn_implementation": "eager"}


def model(run: VtrainRun) -> ModelConfig:
    """The row's model through the ``config.json`` loader (:func:`hf_config`)."""
    return config_from_hf_dict(hf_config(run), f"gpt-h{run.hidden}-l{run.layers}.json")


def strategy(run: VtrainRun) -> Strategy:
    """The row's strategy (module docstring)."""
    split = (run.layers // run.pp,) * run.pp if run.pp > 1 else None
    return Strategy(dp=run.dp, tp=run.tp, pp=run.pp, micro_batch_size=run.micro_batch,
                    global_batch_size=run.global_batch, recompute="full", zero=1, dtype="float16",
                    optimizer="adamw", framework=FRAMEWORK, layers_per_stage=split)


def cost_args(run: VtrainRun, config_path: str) -> list[str]:
    """The ``meshplan cost`` arguments of a row, the model in ``config_path`` (a file
    holding :func:`hf_config`)."""
    args = ["cost", "--model", config_path, "--cluster", CLUSTER, "--nodes", "1",
            "--dp", str(run.dp), "--tp", str(run.tp), "--pp", str(run.pp),
            "--micro-batch-size", str(run.micro_batch), "--global-batch", str(run.global_batch),
            "--seq-len", str(run.seq), "--recompute", "full", "--zero", "1", "--dtype", "float16",
            "--framework", FRAMEWORK]
    if run.pp > 1:
        args += ["--layers-per-stage", "even"]
    return args


__all__ = ["CLUSTER", "COLUMNS", "DATA_CSV", "FRAMEWORK", "VtrainRun", "cost_args", "hf_config", "load",
           "model", "strategy"]
