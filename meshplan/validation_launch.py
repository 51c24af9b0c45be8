"""How ``meshplan validate`` launches a plan and reads the host around it: the torchrun
command for several nodes (:func:`torchrun_command`, :func:`executor_args`), the ranks a
node can take (:func:`check_gpus_per_node`), the host's load before and after
(:func:`host_load`, :func:`load_warning`) and the spread of repeated measurements
(:func:`spread`). The command: ``meshplan.commands.validate``.
"""

from __future__ import annotations

import os
import shlex
import statistics
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.validation_report import DEFAULT_CSV


def host_load() -> float | None:
    """The host's 1-minute load average (None where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def load_warning(before: float | None, after: float | None, cores: int) -> str | None:
    """A warning when the load before or after the run exceeds ``cores`` (the ranks then
    shared the cores with other work and the timings are slow and noisy), else None."""
    worst = max((x for x in (before, after) if x is not None), default=None)
    if worst is None or worst <= cores:
        return None
    return (f"host load {worst:.2f} exceeds its {cores} cores (before {before:.2f}, after "
            f"{after:.2f}): other work shared the cores, the measured times are inflated and noisy")


def spread(times: list[float]) -> float:
    """(max - min) / median of ``times`` (0 for one value)."""
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else 0.0


def check_gpus_per_node(plan: Any, world: int, nnodes: int) -> None:
    """On a GPU cluster (its device states ``sm_count``) each rank takes one GPU: refuse an
    ``--nnodes`` that puts more ranks on a node than it has GPUs, naming the count that
    fits. CPU clusters (gloo) take any number of processes a node."""
    from clusters import load_cluster

    cl = load_cluster(plan.cluster, plan.nodes)
    gpn = int(cl.devices_per_node)
    if cl.spec.device.sm_count is None or world % nnodes or world // nnodes <= gpn:
        return
    need = -(-world // gpn)
    raise MeshplanError(f"--nnodes {nnodes}: {world // nnodes} ranks a node, but a node of cluster "
                     f"{cl.name!r} has {gpn} GPUs (one rank each); use --nnodes {need}")


def torchrun_command(plan_file: str, world: int, nnodes: int, steps: int,
                     endpoint: str = "", extra: list[str] | None = None) -> str:
    """The torchrun command that runs the plan on ``nnodes`` nodes of ``world / nnodes``
    processes each (c10d rendezvous at ``endpoint``, default ``127.0.0.1:29500`` on one
    node, ``HEAD_NODE:29500`` otherwise), with ``extra`` arguments of
    ``meshplan.executor.run`` after ``--steps``; every argument quoted for a POSIX shell.
    Raises MeshplanError when ``nnodes`` does not divide ``world``."""
    if nnodes < 1 or world % nnodes:
        raise MeshplanError(f"--nnodes {nnodes} must divide the plan's {world} ranks")
    endpoint = endpoint or ("127.0.0.1:29500" if nnodes == 1 else "HEAD_NODE:29500")
    args = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(world // nnodes),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "meshplan",
            "-m", "meshplan.executor.run", plan_file, "--steps", str(steps), *(extra or [])]
    return shlex.join(args)


def executor_args(cluster: str, backend: str, csv_path: str, as_json: bool,
                  profile_trace: str, backend_given: bool) -> list[str]:
    """The options of ``validate`` that ``meshplan.executor.run`` takes too, for the printed
    torchrun command: the prediction's cluster, the backend (when given), the CSV (when not
    the default), JSON output and the profile trace directory."""
    out = []
    if cluster:
        out += ["--cluster", cluster]
    if backend_given:
        out += ["--backend", backend]
    if csv_path != DEFAULT_CSV:
        out += ["--csv", csv_path]
    if as_json:
        out.append("--json")
    if profile_trace:
        out += ["--profile-trace", profile_trace]
    return out


@dataclass
class ValidationSummary:
    """What ``meshplan validate`` reports of a local run beside the predicted-vs-measured
    table: the repeats' step times (s; the median is ``meas.step_time``), the numerics check
    (``meshplan.validation.verify``'s result, None: not checked), the host's load
    ``(before, after, cores)`` and its warning, the ZeRO note and the profile trace folder."""

    plan_file: str
    plan: Any
    meas: Any
    times: list[float]
    numerics: Any
    check: bool
    load: tuple[float | None, float | None, int]
    warning: str | None
    note: str | None
    profile_trace: str

    def numerics_dict(self) -> dict[str, Any]:
        """``checked``, ``ok`` (None: not checked) and the one-line ``summary``."""
        n = self.numerics
        return {"checked": n is not None, "ok": None if n is None else bool(n.ok),
                "summary": n.summary() if n is not None else
                "not checked (--no-verify)" if not self.check else
                f"not checked (verify compares fp32 runs at 1e-5; the plan trains in {self.plan.strategy.dtype})"}

    def to_dict(self, repeats: int) -> dict[str, Any]:
        """``validate --json``: the predicted and measured step (ms), relative error, losses,
        peak memory (bytes), the repeats, the host load, warnings and the table's rows."""
        from meshplan.validation_report import report_rows

        rows = report_rows(self.plan, self.meas)
        before, after, cores = self.load
        return {
            "predicted_step_time_ms": rows[0][1], "measured_step_time_ms": rows[0][2],
            "relative_error": self.meas.relative_error(), "losses": self.meas.losses,
            "peak_memory_bytes": self.meas.peak_memory, "repeats": repeats,
            "repeat_step_times_ms": [t * 1e3 for t in self.times], "step_time_spread": spread(self.times),
            "host_load": {"before": before, "after": after, "cores": cores},
            "load_warning": self.warning, "zero_note": self.note, "numerics": self.numerics_dict(),
            "profile_trace": self.profile_trace or None,
            "rows": [{"quantity": q, "predicted": p, "measured": m} for q, p, m in rows]}

    def lines(self, repeats: int) -> list[str]:
        """The text under the table: the repeats' median and spread, the host load, the
        losses, the numerics and where the profiler traces went."""
        times, before, after, cores = self.times, *self.load
        load = " / ".join("-" if x is None else f"{x:.2f}" for x in (before, after))
        out = [f"step time over {repeats} repeat(s): median {self.meas.step_time * 1e3:.3f} ms, spread "
               f"{spread(times):.1%} ({min(times) * 1e3:.3f} .. {max(times) * 1e3:.3f} ms)",
               f"host load before / after: {load} on {cores} cores",
               f"losses: {', '.join(f'{x:.4f}' for x in self.meas.losses)}",
               f"numerics: {self.numerics_dict()['summary']}"]
        if self.profile_trace:
            out.append(f"profiler traces: {str(self.profile_trace).rstrip('/')}/rank<R>.json (meshplan "
                       f"calibrate --from-trace {self.profile_trace} --plan {self.plan_file} -o FITTED.yaml)")
        return out
