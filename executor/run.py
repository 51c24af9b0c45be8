"""``run_plan``: run a plan on torch.distributed and measure it; ``verify``: prove it
computes what one process computes.

Each rank builds the plan's partitioned program (:mod:`executor.program`, the same on every
rank), its :class:`~executor.rank_plan.RankPlan` and the process groups of every collective
in the program, and runs its row of the pipeline schedule the caller gave
(:mod:`executor.actions`; rank ``stage * dp * mp + l`` runs row ``stage``; the executor
never builds schedules itself, ``meshplan.validation`` does). It runs ``warmup + steps`` steps and
returns timings, losses, peak memory and (for verify) its parameter blocks; the parent
reassembles losses and parameters from the blocks (:mod:`executor.assemble`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from completion.context_parallel import CP_OP_TYPES, cp_group
from completion.passes.reshard import value_layout
from executor.actions import ActionOrderError, Rows, schedule_rows, single_stage_order
from executor.assemble import assemble
from executor.launch import LaunchError, launch

STEP_TIMEOUT = 120.0


class PlanMismatchError(LaunchError):
    """The plan does not fit the run: its world size differs from ``nproc``, or the executor
    cannot run its layout (HSDP); refused before launch."""


@dataclass
class Measurement:
    """What a run measured (seconds, bytes) and, when a predictor was given, what the
    simulator predicted for the same plan.

    Attributes:
        step_times: per measured step, the slowest rank's step time.
        step_time: their median.
        losses: per measured step, the global loss (mean over micro-batches).
        actions: per rank, ``(kind, stage, microbatch, chunk, start_s, end_s)`` of the last
            measured step (kind ``O`` = optimizer phase).
        phase_times: per rank, median seconds of its F, B, W, BW actions (last step).
        p2p_log: per rank, ``(send | recv, peer, send op index, micro-batch)`` of every
            p2p op of the last step in the order the rank issued it.
        peak_memory: per rank, peak live tensor bytes (CPU) or CUDA peak allocation (GPU).
        predicted: e.g. ``step_time`` (s), ``max_memory_bytes`` from the simulator.
    """

    nproc: int
    backend: str
    step_times: list[float]
    step_time: float
    losses: list[float]
    actions: list[list[tuple]]
    phase_times: list[dict[str, float]]
    peak_memory: list[int]
    predicted: dict[str, Any] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    replica_drift: float = 0.0
    p2p_log: list[list[tuple[str, int, int, int]]] = field(default_factory=list, repr=False)

    @property
    def max_peak_memory(self) -> int:
        return max(self.peak_memory) if self.peak_memory else 0

    def relative_error(self) -> float | None:
        """(predicted - measured) / measured step time, when a prediction exists."""
        p = self.predicted.get("step_time")
        return None if p is None or self.step_time <= 0 else (p - self.step_time) / self.step_time


def check_plan(plan: Any, nproc: int) -> None:
    """Refuse a plan whose dp * mp * pp differs from ``nproc``, or an HSDP plan (its program
    shards ZeRO-3 over the whole dp mesh dim: the executor would run other groups than the
    ones costed), before launch. Raises PlanMismatchError."""
    s = plan.strategy
    if getattr(s, "fsdp_shard_size", None):
        raise PlanMismatchError(f"strategy field 'fsdp_shard_size' = {s.fsdp_shard_size} (HSDP) is "
                                f"costed and exported, but the executor cannot run it: its program "
                                f"shards ZeRO-3 over the whole dp group; drop fsdp_shard_size to run "
                                f"ZeRO-3 over dp = {s.dp}")
    need = s.world_size
    if need != nproc:
        cp = f"*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp}" if s.cp > 1 else f" = {s.dp}*{s.tp}*{s.pp}"
        raise PlanMismatchError(f"plan needs dp*tp*pp{cp} = {need} ranks but --nproc is {nproc}")


class PlanScheduleError(PlanMismatchError, ActionOrderError):
    """The schedule given for a plan does not fit it (refused before launch)."""


def plan_rows(plan: Any, schedule: Any) -> Rows:
    """The per-stage action rows of ``schedule`` for ``plan`` (checked against its pp,
    micro-batch count and chunks; ``None`` only for one stage). Raises PlanScheduleError."""
    s = plan.strategy
    batch = s.micro_batch_size * s.dp
    m = s.global_batch_size // batch if batch > 0 else 0
    try:
        return schedule_rows(schedule, s.pp, max(m, 1), max(s.vpp, 1))
    except ActionOrderError as e:
        raise PlanScheduleError(str(e)) from None


def program_groups(program: Any) -> list[tuple[int, ...]]:
    """Every rank group the program may use: the groups of its collective ops and of every
    mesh dim of every op's mesh (kernels such as vocab-parallel cross entropy reduce over
    them). The same list on every rank, so groups are created in the same order."""
    out: set[tuple[int, ...]] = set()
    meshes = set()
    for op in program.ops:
        if op.dialect == "dist_op":
            out.update(tuple(g) for g in op.attrs.get("groups", ()) or ())
        if op.dist_attr is not None:
            meshes.add(op.dist_attr.process_mesh)
    for mesh in meshes:
        for m in range(mesh.ndim):
            out.update(tuple(g) for g in mesh.groups(m))
    for op in program.ops:  # context-parallel attention: every rank's cp group
        cp = int(op.attrs.get("context_parallel", 1) or 1) if op.type in CP_OP_TYPES else 1
        if cp > 1 and op.dist_attr is not None:
            stride = int(op.attrs.get("cp_stride", 1))
            out.update(cp_group(r, cp, stride) for r in op.dist_attr.process_mesh.process_ids)
    return sorted(out)


def _phase_medians(times: list[tuple]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for kind, *_, t0, t1 in times:
        out.setdefault(kind, []).append(t1 - t0)
    return {k: statistics.median(v) for k, v in out.items()}


def rank_main(rank: int, nproc: int, plan: Any, steps: int, warmup: int, seed: int,
              single: bool, want_params: bool, adam_epsilon: float | None = None,
              rows: Rows | None = None, progress: Any = None,
              profile_dir: str | None = None) -> dict[str, Any]:
    """One rank's run; ``rows``: the schedule's per-stage actions (None: one stage);
    ``progress``: optional ``(step, action index) -> None`` called before each action;
    ``profile_dir``: after the timed steps, a few more steps run under the profiler and the
    span recorder and their Chrome trace is written to ``DIR/rank<R>.json``
    (:mod:`executor.profile`; never one of the timed steps)."""
    from executor.program import build_program

    pp = build_program(plan, single_process=single, adam_epsilon=adam_epsilon)
    s = pp.strategy
    if rows is None:
        rows = single_stage_order(pp.num_microbatches)
    stage = rank // (s.dp * s.tp)
    dist_on = not single and torch.distributed.is_initialized()
    ex, copies, prank = _rank_executor(pp, rank, single, seed, rows, dist_on)
    step_times, losses, times, peak = _timed_steps(ex, rows[stage], warmup, steps, dist_on, progress)
    if profile_dir:
        from executor.profile import profile_step

        ex.on_action = None
        if dist_on:
            torch.distributed.barrier()
        profile_step(ex, rows[stage], profile_dir, step_times,
                     list(s.layers_per_stage) if s.layers_per_stage else None)
    loss_v = ex.plan.loss
    return {"step_times": step_times, "losses": losses, "times": times, "peak": int(peak),
            "loss_layout": value_layout(loss_v) if loss_v is not None else None,
            "loss_shape": tuple(loss_v.shape) if loss_v is not None else (),
            "params": ex.parameters() if want_params else {}, "p2p_log": list(ex.p2p_log),
            "program_rank": prank, "copy": copies.copy if copies is not None else 0}


def _rank_executor(pp: Any, rank: int, single: bool, seed: int, rows: Rows, dist_on: bool
                   ) -> tuple[Any, Any, int]:
    """The ``RankExecutor`` of ``rank`` over plan program ``pp`` (its communicators, its
    expert-copy group where ``ep < dp`` runs copies of one ep group's program, its context
    parallelism and its pipeline send order), on ``cuda:<rank>`` under an NCCL group, else
    the CPU; returns (executor, the rank's copies or None, its rank in the program)."""
    from executor.collectives import Groups
    from executor.expert_copies import CopyGroups, copies_of
    from executor.p2p_order import send_orders
    from executor.rank_exec import RankExecutor
    from executor.rank_plan import build_rank_plan

    s = pp.strategy
    copies = None if single else copies_of(pp, rank)  # ep < dp: copies of one ep group's program
    if copies is None:
        groups = Groups(program_groups(pp.program), timeout=STEP_TIMEOUT)
        prank = rank
    else:
        world_groups = Groups(copies.world_groups(program_groups(pp.program)), timeout=STEP_TIMEOUT)
        groups, prank = CopyGroups(world_groups, copies), copies.program_rank(rank)
    device = f"cuda:{rank}" if dist_on and torch.distributed.get_backend() == "nccl" else "cpu"
    rplan = build_rank_plan(pp.program, prank)
    ex = RankExecutor(rplan, groups, pp.batch, pp.num_microbatches, seed, device)
    if copies is not None:
        ex.expert_copy = (copies.copy, s.micro_batch_size * s.dp,
                          world_groups.get(copies.copy_group(prank)), copies.count)
    if pp.context_parallel > 1:
        ex.context_parallel = (pp.context_parallel, s.micro_batch_size, s.tp)
    if s.pp > 1:  # send to each peer in its receive order (NCCL matches p2p by order)
        ex.send_order = send_orders(pp.program, rplan, rows, lambda r: r // (s.dp * s.tp))
    return ex, copies, prank


def _timed_steps(ex: Any, actions: Any, warmup: int, steps: int, dist_on: bool, progress: Any
                 ) -> tuple[list[float], list[dict], list, int]:
    """``warmup`` + ``steps`` steps of ``actions`` on executor ``ex``, each after a barrier
    when distributed; returns the timed steps' seconds, their per-micro-batch losses, the
    last step's action times and the peak memory (bytes) over the timed steps."""
    cuda = ex.device.type == "cuda"
    step_times: list[float] = []
    losses: list[dict] = []
    times: list = []
    for i in range(warmup + steps):
        if i == warmup:
            ex.mem.reset_peak()
            if cuda:
                torch.cuda.reset_peak_memory_stats(ex.device)
        if dist_on:
            torch.distributed.barrier()
        if progress is not None:
            ex.on_action = lambda a, step=i: progress(step, a)
        times = ex.run_step(actions)
        ex.average_losses_over_copies()
        if i >= warmup:
            step_times.append(times[-1][-1])
            losses.append({mb: t.numpy() for mb, t in ex.losses.items()})
    peak = torch.cuda.max_memory_allocated(ex.device) if cuda else ex.mem.peak
    return step_times, losses, times, int(peak)


def _rank_main_many(rank: int, nproc: int, jobs: list[tuple]) -> list[dict[str, Any]]:
    """Several plans in one launch (one spawn for many runs): ``jobs`` are argument tuples
    of :func:`rank_main` after ``nproc``."""
    return [rank_main(rank, nproc, *job) for job in jobs]


def gathered_measurement(results: list[dict], nproc: int, backend: str, steps: int, params: bool
                         ) -> Measurement:
    """The :class:`Measurement` of every rank's :func:`rank_main` result (in rank order):
    per step the slowest rank's time, losses and (``params``) parameters reassembled."""
    per_step = [max(res["step_times"][i] for res in results) for i in range(steps)]
    prm, drift = _collect_params(results) if params else ({}, 0.0)
    return Measurement(
        nproc=nproc, backend=backend, step_times=per_step, step_time=statistics.median(per_step),
        losses=_losses(results, steps), actions=[res["times"] for res in results],
        phase_times=[_phase_medians(res["times"]) for res in results],
        peak_memory=[res["peak"] for res in results], params=prm, replica_drift=drift,
        p2p_log=[res.get("p2p_log", []) for res in results])


def run_plans(plans: list[Any], nproc: int, backend: str = "gloo", steps: int = 2,
              warmup: int = 0, seed: int = 0, params: bool = False,
              adam_epsilon: float | None = None, timeout: float = 900.0,
              schedules: list[Any] | None = None, profile_dir: str | None = None) -> list[Measurement]:
    """Run several plans of the same world size one after another in one launch (saves a
    spawn per plan); same arguments as :func:`run_plan`, ``schedules`` one per plan (None
    entries for one-stage plans); ``profile_dir``: the last plan's ranks record a trace of
    a few extra steps there (:func:`rank_main`). Raises what :func:`run_plan` raises, before
    launch for a bad plan or schedule."""
    schedules = [None] * len(plans) if schedules is None else list(schedules)
    if len(schedules) != len(plans):
        raise PlanScheduleError(f"{len(plans)} plans but {len(schedules)} schedules")
    for p in plans:
        check_plan(p, nproc)
    rows = [plan_rows(p, sc) for p, sc in zip(plans, schedules, strict=True)]
    jobs = [(p, steps, warmup, seed, False, params, adam_epsilon, r, None,
             profile_dir if i == len(plans) - 1 else None)
            for i, (p, r) in enumerate(zip(plans, rows, strict=True))]
    per_rank = launch(_rank_main_many, nproc, args=(jobs,), backend=backend, timeout=timeout,
                      collective_timeout=STEP_TIMEOUT)
    return [gathered_measurement([per_rank[r][i] for r in range(nproc)], nproc, backend, steps, params)
            for i in range(len(plans))]


def _losses(results: list[dict], m_steps: int) -> list[float]:
    out = []
    # expert-data-parallel copies (executor.expert_copies): copy 0's ranks, by program rank
    holders = [(res.get("program_rank", r), res) for r, res in enumerate(results)
               if res["losses"] and res["losses"][0] and not res.get("copy", 0)]
    if not holders:
        return out
    layout, shape = holders[0][1]["loss_layout"], holders[0][1]["loss_shape"]
    for step in range(m_steps):
        mbs = sorted(holders[0][1]["losses"][step])
        vals = []
        for mb in mbs:
            glob, _ = assemble(layout, shape, {r: res["losses"][step][mb] for r, res in holders})
            vals.append(float(np.asarray(glob).reshape(-1)[0]))
        out.append(float(np.mean(vals)))
    return out


def _collect_params(results: list[dict]) -> tuple[dict[str, np.ndarray], float]:
    blocks: dict[str, dict[int, Any]] = {}
    layouts: dict[str, Any] = {}
    for r, res in enumerate(results):
        if res.get("copy", 0):  # a later expert-data-parallel copy holds copy 0's values
            continue
        for name, (arr, lay, shape) in res["params"].items():
            blocks.setdefault(name, {})[res.get("program_rank", r)] = arr
            layouts[name] = (lay, shape)
    out, drift = {}, 0.0
    for name, bl in blocks.items():
        lay, shape = layouts[name]
        out[name], d = assemble(lay, shape, bl)
        drift = max(drift, d)
    return out, drift


def run_plan(plan: Any, nproc: int, backend: str = "gloo", steps: int = 10, warmup: int = 2,
             seed: int = 0, predictor: Any = None, timeout: float = 600.0,
             schedule: Any = None, _single: bool = False, _params: bool = False,
             _adam_epsilon: float | None = None, profile_dir: str | None = None) -> Measurement:
    """Run ``plan`` on ``nproc`` ranks for ``warmup + steps`` steps and measure the last
    ``steps``.

    Args:
        plan: a ``meshplan.Plan`` (read duck-typed: ``model``, ``seq_len``, ``strategy``).
        backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank).
        seed: parameter and data seed. predictor: optional ``plan -> dict`` giving the
            simulator's prediction (``meshplan`` passes ``Engine.simulate``); stored in
            ``Measurement.predicted``.
        schedule: the pipeline schedule, read duck-typed (:mod:`executor.actions`: an
            object with ``actions`` or per-stage rows of actions); required when pp > 1.
            ``meshplan.validation.run_plan`` builds it with ``simulator.build_schedule``.
        profile_dir: each rank records a trace of a few extra (unreported) steps to
            ``DIR/rank<R>.json`` (:mod:`executor.profile`).
    Raises:
        PlanMismatchError / LaunchError before launch (world size, backend);
        PlanScheduleError before launch (missing schedule for pp > 1, or one that does
        not fit the plan);
        RankFailure when a rank raises; LaunchTimeout after ``timeout`` seconds.
    """
    rows = None
    if not _single:
        check_plan(plan, nproc)
        rows = plan_rows(plan, schedule)
    if steps < 1 or warmup < 0:
        raise LaunchError(f"steps must be >= 1 and warmup >= 0, got steps={steps} warmup={warmup}")
    args = (plan, steps, warmup, seed, _single, _params, _adam_epsilon, rows, None, profile_dir)
    if _single:  # one rank, no process group: run in this process
        results = [rank_main(0, 1, *args)]
    else:
        results = launch(rank_main, nproc, args=args, backend=backend, timeout=timeout,
                         collective_timeout=STEP_TIMEOUT)
    meas = gathered_measurement(results, nproc, backend, steps, _params)
    if predictor is not None:
        meas.predicted = dict(predictor(plan))
    return meas
