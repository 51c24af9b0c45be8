"""``nccl_tests``: the collective cost model against published nccl-tests bus bandwidths.

``experiments/data/nccl_tests_published.csv`` holds figures NVIDIA engineers and users
published for nccl-tests runs (GitHub issues of NVIDIA/nccl and NVIDIA/nccl-tests, each row
with its URL and the words it quotes): bus bandwidth by collective, message size and node
count on DGX H100, DGX A100 and networks the catalog does not describe (4 x HDR, 8 x 100 Gb
RoCE: ``experiments/data/clusters/*.yaml``). Each row is predicted by
``Cluster.busbw(kind, nbytes, all ranks)`` of the row's cluster at its node count (every
GPU of every node in the group, as nccl-tests runs).

Row ``figure``: ``measured`` (a run's output), ``expected`` (what an NVIDIA engineer said a
system should reach), ``input`` (a figure the model takes as an input: the RoCE NIC
goodput; shown, not a check). :data:`TOLERANCE` is the agreement the tests hold every
``measured`` and ``expected`` row to, except those in :data:`KNOWN_GAPS` (each with the
reason).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.base import ExperimentResult, register_experiment, require
from experiments.tables import to_markdown

NAME = "nccl_tests"
TITLE = "Collectives: predicted vs published nccl-tests bus bandwidth"
DATA = Path(__file__).resolve().parent / "data" / "nccl_tests_published.csv"
REPO = Path(__file__).resolve().parent.parent
#: |predicted / published - 1| every checked row stays within
TOLERANCE = 0.15
#: rows outside the tolerance, and why
KNOWN_GAPS: dict[str, str] = {
    "h100-ag-32nodes": "the run forced NCCL_MIN/MAX_NCHANNELS=16 and one QP per connection "
                       "(NCCL_IB_QPS_PER_CONNECTION=1); the model costs NCCL's defaults",
}


def load_published(path: Path = DATA) -> pd.DataFrame:
    """The published figures (one row each; columns: id, source, locator, cluster, nodes,
    kind, nbytes, busbw_GBps, figure, note)."""
    return pd.read_csv(path)


def _cluster_ref(name: str) -> str:
    """A catalog name as is; a path relative to the repository root made absolute."""
    return str(REPO / name) if name.endswith((".yaml", ".yml")) else name


def predict(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the model's ``predicted_GBps`` (busbw over every rank of
    ``nodes`` nodes), the algorithm it picks, ``error_pct`` = 100 (predicted /
    published - 1) and ``checked`` (a measured or expected row not in
    :data:`KNOWN_GAPS`)."""
    load = require(NAME, "clusters", "load_cluster")
    out = []
    for r in table.itertuples(index=False):
        c = load(_cluster_ref(r.cluster), num_nodes=int(r.nodes))
        ranks = list(range(c.world_size))
        algs = c.collective_algorithms(r.kind, float(r.nbytes), ranks)
        bw = c.busbw(r.kind, float(r.nbytes), ranks) / 1e9
        out.append({**r._asdict(), "ranks": c.world_size, "algorithm": min(algs, key=algs.__getitem__),
                    "predicted_GBps": bw, "error_pct": 100 * (bw / r.busbw_GBps - 1),
                    "checked": r.figure in ("measured", "expected") and r.id not in KNOWN_GAPS})
    return pd.DataFrame(out)


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Predict every published figure (``quick`` changes nothing: the table is small)."""
    df = predict(load_published())
    cols = ["id", "cluster", "nodes", "ranks", "kind", "nbytes", "busbw_GBps", "predicted_GBps",
            "error_pct", "algorithm", "figure", "source"]
    checked = df[df["checked"]]
    within = int((checked["error_pct"].abs() <= 100 * TOLERANCE).sum())
    notes = [f"{within} of {len(checked)} checked figures within ±{TOLERANCE:.0%}; mean |error| "
             f"{checked['error_pct'].abs().mean():.1f}%, worst {checked['error_pct'].abs().max():.1f}%."]
    notes += [f"{k}: not checked, {v}." for k, v in KNOWN_GAPS.items()]
    desc = (f"Rows of `{DATA.relative_to(REPO)}`, each predicted by `Cluster.busbw` on every "
            "rank of its cluster at its node count; sources and quoted words in the CSV.")
    return ExperimentResult(NAME, TITLE, df[cols], desc, notes, float_format=".1f")


def main(argv: list[str] | None = None) -> int:
    """Print the comparison as a Markdown table."""
    del argv
    df = predict(load_published())
    print(to_markdown(df[["id", "nodes", "kind", "nbytes", "busbw_GBps", "predicted_GBps",
                          "error_pct", "algorithm", "figure"]], ".1f"))
    return 0

