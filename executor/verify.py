"""``verify(plan, nproc)``: the distributed run of a plan must compute what one process
computes — same loss at every step and the same parameters after the updates.

The reference runs the same model unpartitioned on one rank (``build_program(...,
single_process=True)``): for a model built from a config the whole global batch is one
micro-batch, so micro-batch splitting, pipeline stages, tensor and data parallelism,
ZeRO and the reshard collectives are all checked at once; a given program keeps its batch
and the same micro-batches. Both start from the same seed (parameters and data depend only
on names and global shapes, :mod:`executor.data`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executor.run import Measurement, check_plan, run_plan, run_plans

RTOL = 1e-5
# Adam's first steps divide by sqrt(v) ~ |g|: an element whose gradient sits at fp32
# rounding level moves by up to lr in either direction, so two correct fp32 runs that only
# sum in a different order differ by ~lr there. verify therefore runs Adam-family plans
# with this epsilon (well above fp32 gradient noise); pass adam_epsilon=None to keep 1e-8.
VERIFY_ADAM_EPSILON = 1e-4


@dataclass
class VerifyResult:
    """Relative errors (max |a - b| / max |b|) of losses and of each parameter."""

    ok: bool
    loss_error: float
    param_errors: dict[str, float]
    losses: list[float]
    reference_losses: list[float]
    missing: list[str] = field(default_factory=list)
    replica_drift: float = 0.0

    @property
    def worst(self) -> tuple[str, float]:
        if not self.param_errors:
            return ("", 0.0)
        k = max(self.param_errors, key=self.param_errors.get)
        return k, self.param_errors[k]

    def summary(self) -> str:
        name, err = self.worst
        status = "OK" if self.ok else "MISMATCH"
        return (f"{status}: loss rel err {self.loss_error:.2e}, worst parameter {name!r} "
                f"rel err {err:.2e} over {len(self.param_errors)} parameters"
                + (f", missing {self.missing}" if self.missing else ""))


def _merged(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one shape is the other with its two leading dims merged (an expert weight
    ``[g, E / g, in, out]`` against ``[E, in, out]``, ``ModelConfig.expert_grid``)."""
    long, short = (a, b) if len(a) > len(b) else (b, a)
    return len(long) == len(short) + 1 and long[0] * long[1] == short[0] and long[2:] == short[1:]


def rel_error(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape and _merged(a.shape, b.shape):  # a grouped expert grid vs [E, ...]
        a = a.reshape(b.shape)
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
    return float(np.max(np.abs(a - b))) / scale if a.size else 0.0


def verify(plan: Any, nproc: int, steps: int = 2, seed: int = 0, rtol: float = RTOL,
           backend: str = "gloo", adam_epsilon: float | None = VERIFY_ADAM_EPSILON,
           schedule: Any = None) -> VerifyResult:
    """Run ``plan`` on ``nproc`` ranks and on one process for ``steps`` steps (no warmup)
    and compare every step's loss and every parameter after the last update; ``ok`` when
    all relative errors are <= ``rtol`` (fp32: 1e-5). ``schedule``: the pipeline schedule
    (required when pp > 1, see ``run_plan``; ``meshplan.validation.verify`` builds it).
    Raises what ``run_plan`` raises."""
    check_plan(plan, nproc)
    kw = {"steps": steps, "warmup": 0, "seed": seed, "_params": True, "_adam_epsilon": adam_epsilon,
          "schedule": schedule}
    dist: Measurement = run_plan(plan, nproc, backend, **kw)
    return compare(dist, reference(plan, steps, seed, adam_epsilon), rtol)


def reference(plan: Any, steps: int = 2, seed: int = 0,
              adam_epsilon: float | None = VERIFY_ADAM_EPSILON) -> Measurement:
    """The single-process run of ``plan`` (in this process, no process group)."""
    return run_plan(plan, 1, "gloo", steps=steps, warmup=0, seed=seed, _single=True,
                    _params=True, _adam_epsilon=adam_epsilon)


def compare(dist: Measurement, ref: Measurement, rtol: float = RTOL) -> VerifyResult:
    """Losses and parameters of a distributed run against the reference run."""
    loss_err = rel_error(dist.losses, ref.losses) if dist.losses else float("inf")
    errs = {k: rel_error(dist.params[k], v) for k, v in ref.params.items() if k in dist.params}
    missing = sorted(set(ref.params) - set(dist.params))
    ok = loss_err <= rtol and not missing and all(e <= rtol for e in errs.values())
    return VerifyResult(ok, loss_err, errs, dist.losses, ref.losses, missing, dist.replica_drift)


def verify_many(plans: list[Any], nproc: int, steps: int = 2, seed: int = 0, rtol: float = RTOL,
                backend: str = "gloo", adam_epsilon: float | None = VERIFY_ADAM_EPSILON,
                schedules: list[Any] | None = None) -> list[VerifyResult]:
    """:func:`verify` for several plans of one world size with a single launch
    (``schedules``: one per plan, None for one-stage plans)."""
    dists = run_plans(plans, nproc, backend, steps=steps, seed=seed, params=True,
                      adam_epsilon=adam_epsilon, schedules=schedules)
    return [compare(d, reference(p, steps, seed, adam_epsilon), rtol) for d, p in zip(dists, plans, strict=True)]
