"""Zero Bubble paper inputs and published outputs, and the one method that turns a Table 9
row into simulator inputs.

Source: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv:2401.10241),
transcribed in shared/reference/published_tables.md (Table 9 all rows, Table 5 1.5B rows,
Table 4 1.5B rows) and shared/reference/hardware_and_models.md (Table 3 model shapes).
The ZB-2p column of Table 5 is not in that file; it is taken from the paper's Table 5
(arXiv v1), as tests/simulator/test_engine.py cites it.

Method (the same as tests/simulator/test_engine.py and issue 6):

* Table 9 gives per-stage, per-micro-batch T_F, T_B, T_W and T_comm in ms; they enter the
  simulator as seconds, identical for every stage.
* T_comm is a pure delay on every cross-stage dependency (an F waits for the previous
  stage's F plus T_comm, a B for the next stage's B plus T_comm); it never occupies a
  device (``simulator.simulate_pipeline``'s ``comm_time``).
* 1F1B-I (interleaved 1F1B, one layer per chunk): the first and last stages carry one
  transformer layer less than the others and hold the embedding and the loss instead
  (published_tables.md, note under Table 3), so each stage holds (layers + 2) / p
  layer-equivalents; that is the
  chunk count v, and each chunk takes 1/v of the Table 9 stage time. Every chunk boundary
  costs one T_comm hop. For 1.5B: (22 + 2) / 8 = 3.
* ZB-1p / ZB-2p: our automatic ``ZB`` schedule with a memory limit of p / 2p micro-batches
  of activations (M_B units), given the same stage times and T_comm.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.base import ExperimentError

MS = 1e-3


@dataclass(frozen=True)
class ZBModel:
    """A model of the paper's Table 3 (shape from shared/reference/hardware_and_models.md)."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    micro_batch: int | None  # sequences per micro-batch, where published


@dataclass(frozen=True)
class Table9Row:
    """One row of Table 9: per-stage, per-micro-batch times in ms."""

    model: str
    p: int
    m: int
    t_f: float
    t_b: float
    t_w: float
    t_comm: float


MODELS = {
    "1.5B": ZBModel("1.5B", 22, 2304, 24, 1024, 6),
    "6.2B": ZBModel("6.2B", 30, 4096, 32, 1024, None),
    "14.6B": ZBModel("14.6B", 46, 5120, 40, 1024, None),
    "28.3B": ZBModel("28.3B", 62, 6144, 48, 1024, None),
}

TABLE9 = [
    Table9Row("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601),
    Table9Row("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626),
    Table9Row("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762),
    Table9Row("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527),
    Table9Row("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577),
    Table9Row("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535),
    Table9Row("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377),
    Table9Row("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379),
    Table9Row("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378),
    Table9Row("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408),
    Table9Row("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408),
    Table9Row("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460),
]

# Table 5 bubble rates, keyed by (model, m); ZB-2p from the paper's Table 5 (arXiv v1).
TABLE5 = {
    ("1.5B", 24): {"1F1B": 0.2431, "1F1B-I": 0.1055, "ZB-H1": 0.1585, "ZB-H2": 0.1083,
                   "ZB-2p": 0.0433},
    ("1.5B", 32): {"1F1B": 0.1985, "1F1B-I": 0.0818, "ZB-H1": 0.1242, "ZB-H2": 0.0837,
                   "ZB-2p": 0.0039},
    ("1.5B", 64): {"1F1B": 0.1240, "1F1B-I": 0.0443, "ZB-H1": 0.0674, "ZB-H2": 0.0444,
                   "ZB-2p": 0.0026},
}

# Issue 6 "Done when": absolute tolerance on the bubble rate per schedule.
TOLERANCE = {"1F1B": 0.003, "ZB-H1": 0.003, "ZB-H2": 0.003, "1F1B-I": 0.01, "ZB-2p": 0.01}

# Table 4 (1.5B, 8 GPUs): samples per GPU per second and peak memory (GB), keyed by m.
TABLE4 = {
    24: {"throughput": {"ZB-2p": 14.5, "ZB-1p": 12.9, "1F1B": 11.8, "1F1B-I": 13.1},
         "memory_gb": {"ZB-2p": 59, "ZB-1p": 32, "1F1B": 30, "1F1B-I": 40}},
    32: {"throughput": {"ZB-2p": 14.8, "ZB-1p": 13.4, "1F1B": 12.5, "1F1B-I": 13.4},
         "memory_gb": {"ZB-2p": 59, "ZB-1p": 32, "1F1B": 30, "1F1B-I": 40}},
    64: {"throughput": {"ZB-2p": 14.9, "ZB-1p": 14.2, "1F1B": 13.6, "1F1B-I": 13.9},
         "memory_gb": {"ZB-2p": 59, "ZB-1p": 32, "1F1B": 30, "1F1B-I": 40}},
}


def stage_times(row: Table9Row) -> tuple[dict[str, float], float]:
    """``({"F", "B", "W"} seconds per stage and micro-batch, T_comm seconds)`` of a row."""
    return {"F": row.t_f * MS, "B": row.t_b * MS, "W": row.t_w * MS}, row.t_comm * MS


def interleaved_chunks(model: ZBModel, p: int) -> int:
    """Chunks per rank of 1F1B-I with one layer(-equivalent) per chunk: (layers + 2) / p,
    embedding and loss each counting as one layer on the first/last stage.

    Raises:
        ValueError: (layers + 2) is not a multiple of p (the split would be uneven).
    """
    total = model.layers + 2
    if total % p:
        raise ExperimentError(
            f"1F1B-I for {model.name}: layers + 2 = {total} is not a multiple of p = {p}")
    return total // p


# Paper schedule label -> (our schedule name, how to get v / the memory limit).
PAPER_SCHEDULES = ("1F1B", "1F1B-I", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")
OUR_NAME = {"1F1B": "1F1B", "1F1B-I": "VPP", "ZB-H1": "ZBH1", "ZB-H2": "ZBH2",
            "ZB-1p": "ZB", "ZB-2p": "ZB"}


def schedule_args(label: str, row: Table9Row) -> tuple[str, int, dict]:
    """``(name, num_chunks, options)`` for ``simulator.build_schedule`` of a paper label.

    Raises:
        ValueError: unknown label.
    """
    if label not in OUR_NAME:
        raise ExperimentError(f"unknown Zero Bubble schedule label {label!r}; known: {PAPER_SCHEDULES}")
    name = OUR_NAME[label]
    if label == "1F1B-I":
        return name, interleaved_chunks(MODELS[row.model], row.p), {}
    if name == "ZB":
        st, comm = stage_times(row)
        limit = row.p if label == "ZB-1p" else 2 * row.p
        return name, 1, {"memory_limit": limit, "stage_times": st, "comm_time": comm}
    return name, 1, {}
