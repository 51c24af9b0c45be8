"""Fit the cost model's per-device constants on named rows of measured_runs.csv.

At most two constants per device type are fitted (issue 14): the GEMM plateau efficiency
(``device.efficiency.gemm``) and the efficiency of llm-foundry's Triton FlashAttention
kernel (``device.efficiency.attention_kernels.triton``), both on the rows
:data:`FIT_ROWS` names: half of each source's rows of the device, by a fixed rule; the
other half is held out. Everything else
is physical (datasheets, published kernel benchmarks, framework code). A constant is fitted
by golden-section search of the mean absolute percentage error over its rows, the device's
other constant held; the two are iterated. The result is printed with the error on the
fitted rows and on every other row of the device (held out); the values are then written,
with that provenance, into the cluster YAMLs of the device (``clusters/catalog``) and into
``experiments.measured_runs.FITS`` by hand.

Run: ``python -m experiments.fit_constants`` (a few minutes); ``--unfitted`` prints the
error over every row with the physical defaults the fit replaces (:func:`unfitted`).

One framework constant is fitted besides (not a device's): the host seconds per kernel
launch of the ``megatron-deepspeed`` profile (``host.kernel_launch_s``,
``simulator.host_time``), the Python / dispatcher / launch time of an eager
Megatron-DeepSpeed step on its host, on the vTrain rows of :func:`host_fit_rows` (every
second sweep of ``shared/data/vtrain_single_node.csv``; the others are held out):
``python -m experiments.fit_constants --host`` (:func:`fit_host`, about half an hour). The
value is written into the profile YAML by hand.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.base import require
from experiments.measured_rows import RunSpec, parse_all

#: device type -> the catalog clusters built on it
DEVICES: dict[str, tuple[str, ...]] = {
    "A100": ("selene", "dgx-a100-80g", "dgx-a100-40g", "zb-paper-a100"),
    "H100": ("dgx-h100", "grand-teton-h100-96g", "hgx-h200"),
}


@dataclass(frozen=True)
class Constant:
    """One fitted constant: a field of ``device.efficiency`` (dotted below it) and the rows
    it is fitted on."""

    device: str
    field: str
    rows: tuple[int, ...]
    lo: float = 0.05
    hi: float = 1.0


#: the rows each device's two constants are fitted on: every second row, by row id, of each
#: source among the device's expressible rows (as parsed on 2026-12-01; 165 of 171 rows),
#: starting with the source's first row. A rule fixed before fitting, so the fitted half
#: spans every source, model size and sequence length of the file as the held-out half does;
#: it replaced four hand-picked A100 rows (15, 18, 250, 188) whose fit left every A100
#: source about 6% too fast (signed error -6.3% over the 79 A100 rows; row 188 alone +9.9%).
FIT_ROWS: dict[str, tuple[int, ...]] = {
    "A100": (15, 17, 19, 21, 23, 170, 174, 178, 182, 186, 190, 194, 198, 202, 206, 210, 214, 218,
             222, 226, 230, 234, 238, 242, 246, 250, 254, 258, 262, 266, 270, 274, 278, 282, 286,
             290, 294, 298, 302, 306),
    "H100": (60, 62, 64, 66, 68, 70, 92, 96, 100, 104, 108, 112, 116, 120, 124, 128, 132, 136, 140,
             144, 148, 152, 156, 160, 164, 168, 308, 312, 316, 320, 324, 328, 332, 336, 340, 344,
             348, 352, 356, 360, 364, 368, 372, 376),
}

#: what is fitted on which rows: per device the GEMM plateau and the Triton FlashAttention
#: efficiency (which moves only llm-foundry rows), both on the device's :data:`FIT_ROWS`
FIT_PLAN: tuple[Constant, ...] = tuple(
    Constant(dev, field, rows) for dev, rows in FIT_ROWS.items()
    for field in ("gemm", "attention_kernels.triton"))


#: FlashAttention-1 / FlashAttention-2 throughput: FA2 is "2x faster than FlashAttention"
#: (Dao 2023, FlashAttention-2, abstract; FA1 reached 25-40% of an A100's peak), and
#: llm-foundry's Triton kernel (flash-attn's ``flash_attn/flash_attn_triton.py``, FA1's
#: algorithm in pre-MLIR Triton) is, per that file's docstring, "slightly slower than CUDA
#: forward + backward" of FA1. So the physical default of the Triton kernel is half the
#: device's FlashAttention-2 efficiency.
TRITON_OVER_FLASH2 = 0.5

#: the physical GEMM plateau default (shared/reference: Paddle's cost model charges
#: FLOPs / (0.65 x peak))
GEMM_DEFAULT = 0.65


def _flash2(device: str) -> float:
    """The catalog's FlashAttention-2 efficiency of ``device`` (its first cluster)."""
    load = require("fit_constants", "clusters", "load_cluster")
    return float(load(DEVICES[device][0]).device.efficiency.attention_kernels["flash2"].value)


def unfitted() -> dict[str, dict[str, float]]:
    """The physical defaults the fit replaces (the "no fitted constant" check of issue 14),
    per device type: GEMM plateau :data:`GEMM_DEFAULT`, Triton FlashAttention at
    :data:`TRITON_OVER_FLASH2` x the device's FlashAttention-2 efficiency (A100: 0.5 x 0.55 =
    0.275; H100: 0.5 x 0.33 = 0.165)."""
    return {d: {"gemm": GEMM_DEFAULT, "attention_kernels.triton": TRITON_OVER_FLASH2 * _flash2(d)}
            for d in DEVICES}


def device_of(cluster: str) -> str | None:
    """The device type of a catalog cluster name (None: none of :data:`DEVICES`)."""
    return next((d for d, names in DEVICES.items() if cluster in names), None)


def with_efficiency(cluster: Any, values: dict[str, float]) -> Any:
    """A copy of ``cluster`` (``clusters.Cluster``) whose ``device.efficiency`` fields
    (dotted paths) take ``values``, provenance "fit candidate"."""
    from clusters.cluster import Cluster
    from clusters.spec import ClusterSpec

    data = cluster.spec.model_dump()
    for path, v in values.items():
        node = data["device"]["efficiency"]
        *parents, leaf = path.split(".")
        for p in parents:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
        node[leaf] = {"value": float(v), "provenance": "fit candidate"}
    return Cluster(ClusterSpec.model_validate(data), cluster.num_nodes)


def row_error(spec: RunSpec, values: dict[str, float]) -> float:
    """Signed relative error of the prediction of ``spec`` with the device's constants
    ``values`` (NaN when the Engine refuses it)."""
    engine_cls = require("fit_constants", "meshplan.engine", "Engine")
    load = require("fit_constants", "clusters", "load_cluster")
    try:
        cl = with_efficiency(load(spec.cluster, spec.nodes), values)
        res = engine_cls(spec.model, cl, spec.strategy, seq_len=spec.seq_len).simulate()
    except Exception:  # a row the model cannot cost does not steer the fit
        return math.nan
    return res.step_time / spec.step_time_s - 1.0


def mape(errors: Sequence[float]) -> float:
    """Mean absolute percentage error (percent) of the finite errors."""
    ok = [abs(e) for e in errors if math.isfinite(e)]
    return 100.0 * sum(ok) / len(ok) if ok else math.nan


def golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 18) -> float:
    """Minimiser of a unimodal ``f`` on [lo, hi] by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit(plan: Sequence[Constant] = FIT_PLAN, rounds: int = 2,
        start: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    """Fitted values per device type: ``{device: {field: value}}`` (see module docstring)."""
    specs = {s.row_id: s for s in parse_all() if isinstance(s, RunSpec)}
    values: dict[str, dict[str, float]] = {d: dict(v) for d, v in (start or {}).items()}
    for _ in range(rounds):
        for c in plan:
            cur = values.setdefault(c.device, {})
            rows = [specs[r] for r in c.rows]

            def loss(x: float, c: Constant = c, cur: dict = cur, rows: list = rows) -> float:
                trial = {**cur, c.field: x}
                return mape([row_error(s, trial) for s in rows])

            cur[c.field] = round(golden(loss, c.lo, c.hi), 4)
    return values


def report(values: dict[str, dict[str, float]], plan: Sequence[Constant] = FIT_PLAN) -> str:
    """The fitted values and, per device, the MAPE on the fitted and the held-out rows."""
    specs = [s for s in parse_all() if isinstance(s, RunSpec)]
    fitted = {r for c in plan for r in c.rows}
    lines = []
    for dev, vals in values.items():
        lines.append(f"{dev}: " + ", ".join(f"{k} = {v}" for k, v in vals.items()))
        mine = [s for s in specs if device_of(s.cluster) == dev]
        fe = [row_error(s, vals) for s in mine if s.row_id in fitted]
        he = [row_error(s, vals) for s in mine if s.row_id not in fitted]
        lines.append(f"  fitted rows: n={len(fe)} MAPE {mape(fe):.1f}%; held out: n={len(he)} "
                     f"MAPE {mape(he):.1f}%")
    return "\n".join(lines)


def report_all(values: dict[str, dict[str, float]]) -> str:
    """MAPE, worst row and count over every expressible row with the per-device
    ``values`` (e.g. :func:`unfitted`)."""
    errs = [(s.row_id, row_error(s, values.get(device_of(s.cluster) or "", {})))
            for s in parse_all() if isinstance(s, RunSpec)]
    ok = [(r, e) for r, e in errs if math.isfinite(e)]
    worst = max(ok, key=lambda x: abs(x[1]))
    return (f"all rows: n={len(ok)} MAPE {mape([e for _, e in ok]):.1f}%; worst row {worst[0]} "
            f"({100 * worst[1]:+.1f}%); {sum(1 for _, e in ok if abs(e) > 0.15)} rows beyond 15%")


#: the framework and profile field :func:`fit_host` fits
HOST_FRAMEWORK = "megatron-deepspeed"


def host_fit_rows() -> tuple[set[int], set[int]]:
    """(fitted, held-out) row ids of ``shared/data/vtrain_single_node.csv``: the sweeps
    (``experiments.vtrain_single_node.SWEEP_KEYS``: GPUs, global batch, hidden, layers)
    sorted by key, every second one from the first fitted -- a rule fixed before fitting,
    so both halves span every GPU count, model and batch."""
    from experiments.vtrain_rows import load

    runs = load()
    keys = sorted({(r.gpus, r.global_batch, r.hidden, r.layers) for r in runs})
    fit_keys = set(keys[::2])
    fitted = {r.row_id for r in runs if (r.gpus, r.global_batch, r.hidden, r.layers) in fit_keys}
    return fitted, {r.row_id for r in runs} - fitted


#: the physical default of the host time per launch (the "no fitted constant" check): the
#: published A100 figure, an upper bound -- awslabs/keys_values PR 105: an eager training
#: forward of 18,012 kernels took 691.3 ms wall on an A100-40GB, 38.4 us a kernel, with the
#: GPU idle 44% of it (facebookresearch/sam2 issue 768 measured 45.3 us a launch on an A6000
#: host, inference)
HOST_UNFITTED = 38.4e-6


def vtrain_errors(launch_s: float, rows: set[int], gemm: float | None = None) -> list[float]:
    """Signed relative errors of the vTrain ``rows`` with the megatron-deepspeed profile's
    ``host.kernel_launch_s`` = ``launch_s`` (and the GEMM plateau ``gemm`` when given): the
    host seconds the step model reads per launch are swapped for this call
    (``simulator.stage_cost.host_seconds``, read when an action's dispatch is composed), so
    the block costs, cached once, serve every candidate."""
    from unittest import mock

    import simulator.stage_cost as stage_cost
    from experiments.vtrain_rows import CLUSTER, load, model, strategy
    from meshplan.engine import Engine

    real = stage_cost.host_seconds

    def candidate(profile: Any, launches: int, collectives: int = 0) -> float:
        if getattr(profile, "name", None) != HOST_FRAMEWORK:
            return real(profile, launches, collectives)
        return (launches + collectives) * float(launch_s)

    out = []
    with mock.patch.object(stage_cost, "host_seconds", candidate):
        for r in load():
            if r.row_id not in rows:
                continue
            try:
                t = Engine(model(r), CLUSTER, strategy(r), nodes=1, seq_len=r.seq,
                           gemm_efficiency=gemm).simulate()
                out.append(t.step_time * 1e3 / r.measured_ms - 1.0)
            except Exception:  # a row the model cannot cost does not steer the fit
                out.append(math.nan)
    return out


def fit_host(lo: float = 1e-6, hi: float = 1e-4, steps: int = 14) -> tuple[float, float, float]:
    """(fitted ``host.kernel_launch_s``, MAPE % on the fitted rows, on the held-out rows)
    of :func:`host_fit_rows`, by golden-section search of the fitted rows' MAPE."""
    fitted, held = host_fit_rows()
    best = round(golden(lambda x: mape(vtrain_errors(x, fitted)), lo, hi, steps), 7)
    return best, mape(vtrain_errors(best, fitted)), mape(vtrain_errors(best, held))


def main(argv: list[str] | None = None) -> int:
    """Fit and print (see module docstring); ``--unfitted``: only the error over every row
    with the physical defaults (:func:`unfitted`); ``--host``: the megatron-deepspeed
    host dispatch time on the vTrain rows (:func:`fit_host`); ``--host --unfitted``: the
    vTrain rows with :data:`GEMM_DEFAULT` and :data:`HOST_UNFITTED`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--host" in args and "--unfitted" in args:
        fitted, held = host_fit_rows()
        err = vtrain_errors(HOST_UNFITTED, fitted | held, GEMM_DEFAULT)
        print(f"vTrain rows with physical defaults only (GEMM plateau {GEMM_DEFAULT}, host "
              f"{HOST_UNFITTED * 1e6:.1f} us a launch): n={len(err)} MAPE {mape(err):.2f}%")
        return 0
    if "--host" in args:
        value, fe, he = fit_host()
        fitted, held = host_fit_rows()
        print(f"{HOST_FRAMEWORK} host.kernel_launch_s = {value:.7g} s; fitted rows n={len(fitted)} "
              f"MAPE {fe:.2f}%, held-out rows n={len(held)} MAPE {he:.2f}%")
        return 0
    if "--unfitted" in args:
        defaults = unfitted()
        print("physical defaults only (" + "; ".join(
            f"{d}: " + ", ".join(f"{k} = {v:.4g}" for k, v in vals.items())
            for d, vals in defaults.items()) + ")")
        print(report_all(defaults))
        return 0
    values = fit()
    print(report(values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
