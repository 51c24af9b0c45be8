"""Run and verify plans on torch.distributed with the schedule the simulator plays.

The executor never imports the simulator (docs/design.md: executor -> completion, clusters);
``meshplan`` may import both, so it builds each plan's pipeline schedule with
``simulator.build_schedule`` and passes it to ``executor.run_plan`` / ``executor.verify``
(``schedule=``), together with the simulator's prediction.

Schedules: for a prediction, the very schedule ``simulator.step.StepModel.run`` played
(``StepResult.schedule``: for the time-aware ``ZB`` and ``ZBVPP`` heuristics the one built
from the simulated stage times), and the layer split it costed, so the measured step runs
the order and the stages that were predicted. The
prediction uses the ``eager`` framework profile, the executor's own way of running a step
(separate gradient accumulation: an add per parameter gradient per later micro-batch and
the 1/m scaling; nothing fused or overlapped). For
verification only the numerics matter, and the plain registered schedule is used.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from meshplan.errors import MeshplanError
from simulator.schedules import Schedule, build_schedule
from simulator.stage_cost import PHASES


def _num_microbatches(strategy: Any) -> int:
    return max(1, strategy.global_batch_size // (strategy.micro_batch_size * strategy.dp))


def plain_schedule(plan: Any) -> Schedule:
    """The plan's registered schedule without stage times (``Strategy.registered_schedule()`` names it;
    one stage gets 1F1B). Raises ``simulator.schedules.ScheduleError`` for an illegal
    (pp, m, vpp) combination."""
    s = plan.strategy
    name, limit = s.registered_schedule()
    return build_schedule(name, s.pp, _num_microbatches(s), s.vpp, limit)


#: the ZeRO stage whose memory the executor holds: it runs ZeRO-2/3's collectives (the
#: gradient reduce-scatter, the blockwise update and gather) but keeps every gradient and
#: parameter whole (README, Limits), so a plan of stage 2 or 3 is predicted as stage 1
EXECUTOR_MAX_ZERO = 1


def zero_note(plan: Any) -> str | None:
    """The line ``validate`` prints when the plan's ZeRO stage is above what the executor
    holds in memory (:data:`EXECUTOR_MAX_ZERO`); None otherwise."""
    z = plan.strategy.zero
    if z <= EXECUTOR_MAX_ZERO:
        return None
    return (f"the plan is ZeRO-{z}; the executor keeps gradients and parameters whole (ZeRO-"
            f"{EXECUTOR_MAX_ZERO} memory), so the memory compared here is ZeRO-{EXECUTOR_MAX_ZERO}'s; "
            f"its per-parameter ZeRO-{z} collectives are not in the eager profile's step time "
            f"either (about +50% measured on a 2-rank CPU plan): the step time is not comparable")


def predict(plan: Any, cluster: Any = None) -> tuple[dict[str, Any], Schedule]:
    """The simulator's prediction for ``plan`` on ``cluster`` (default: the plan's own)
    and the schedule it played (``StepResult.schedule``), as the executor runs it: under
    the ``eager`` profile and at most ZeRO-1 (:data:`EXECUTOR_MAX_ZERO`).

    Returns ``({"step_time": s, "max_memory_bytes": B (the heaviest rank's tensors, as
    the executor measures them), "stage_times": [{F, B, W} s per virtual stage], "rank_stage_times": [{F, B, W} s per pipeline rank, mean over its
    chunks], "time_breakdown": {...}, "layers_per_vstage": [...], "executor_attention_bytes":
    B (:func:`executor_attention_bytes`, for the host check only)}, schedule)``. Raises
    ``EngineError`` (a ValueError) for a plan the cost model cannot cost."""
    from meshplan.engine import Engine

    # the executor runs the plan: its profile is "eager" (separate gradient accumulation
    # and the 1/m scaling, nothing fused or overlapped), whatever framework the plan names,
    # and its memory is ZeRO-1's at most (EXECUTOR_MAX_ZERO: whole gradients and parameters)
    s = plan.strategy.replace(framework="eager")
    if s.zero > EXECUTOR_MAX_ZERO:  # an HSDP group goes with ZeRO-3
        s = s.replace(zero=EXECUTOR_MAX_ZERO, fsdp_shard_size=None)
    eager = dataclasses.replace(plan, strategy=s)
    engine = Engine.from_plan(eager, cluster)
    res = engine.step_model().run()
    sched = res.schedule
    per_rank = [{ph: sum(res.stage_times[vs][ph] for vs in vss) / len(vss) for ph in PHASES}
                for vss in sched.vstage]  # what one action of a pipeline rank takes, on average
    # the executor measures live tensor bytes (CPU) or torch.cuda.max_memory_allocated
    # (GPU): the allocator's lines without its fragmentation (simulator.step_memory)
    from simulator.step_memory import allocated_bytes

    pred = {"step_time": res.step_time,
            "max_memory_bytes": max(allocated_bytes(m) for m in res.memory_per_stage),
            "stage_times": res.stage_times, "rank_stage_times": per_rank,
            "time_breakdown": res.time_breakdown, "layers_per_vstage": list(res.layers_per_vstage),
            "executor_attention_bytes": executor_attention_bytes(engine.source, engine.strategy)}
    return pred, sched


def host_memory_bytes() -> int | None:
    """Memory this machine can give the ranks: ``MemAvailable`` of /proc/meminfo, else the
    physical memory; None when neither is known."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


#: attention-score-sized tensors the executor's attention kernels hold at once, in their
#: statistics dtype (float32 for a plan's bf16, fp16 or fp32): executor/kernels/attention.py
#: and executor/ring_attention.py compute a block whole -- the scaled and masked scores,
#: exp(S - lse), and in the backward dP = dO V^T, dP - D and dS = P (dP - D) besides the
#: scores and P: 5 at the backward's peak
EXECUTOR_SCORE_TENSORS = 5


def executor_attention_bytes(source: Any, strategy: Any) -> int:
    """Bytes the executor's attention kernel holds inside one op beyond the tensors it is
    given and returns (which the executor's live-tensor count and the prediction hold):
    :data:`EXECUTOR_SCORE_TENSORS` x micro-batch x local query heads x s_q x s_k x the
    statistics dtype's bytes (float32 for every plan dtype), with s_q = s / cp and s_k = s / cp for ring attention's
    blocks, s for all-gathered K/V (and s without cp). FlashAttention holds none of this
    (it keeps one tile of the scores on chip), so the prediction, costed with flash
    attention, does not either; only the host check (:func:`check_fits_host`) adds it.

    ``source``: the plan's ``completion.models.source.ModelSource``; a given program (no
    config) counts its largest ``flash_attention`` op's global [b, s, h, d] query over the
    plan's dp and tp. 0 under ``strategy.attention`` unfused (the Engine's resolved one):
    the program then has no flash_attention op, its score ops being in the prediction. E.g. llama2-7b at s 32768, micro-batch 1, tp 1: 5 x 32 x 32768^2 x 4
    = 640 GiB."""
    st = 4  # float32: the statistics dtype of every plan dtype (bf16, fp16, fp32)
    cp = max(1, int(getattr(strategy, "cp", 1) or 1))
    cfg = getattr(source, "config", None)
    if cfg is not None and getattr(strategy, "attention", None) == "unfused":
        return 0  # no flash_attention op: the program's own score ops are in the prediction
    if cfg is not None:
        b, heads, s = strategy.micro_batch_size, cfg.num_heads // strategy.tp, source.seq_len
    else:
        shapes = [op.operands[0].type.shape for op in getattr(source.program, "ops", ())
                  if op.type == "flash_attention" and op.operands and op.operands[0] is not None
                  and len(getattr(op.operands[0].type, "shape", ())) == 4]
        if not shapes:
            return 0
        bq, s, hq, _ = max(shapes, key=lambda sh: sh[0] * sh[1] * sh[1] * sh[2])
        b, heads = max(1, bq // strategy.dp), max(1, hq // strategy.tp)
    s_q = s // cp
    s_k = s if cp == 1 or getattr(strategy, "cp_comm", "p2p") == "all_gather" else s // cp
    return EXECUTOR_SCORE_TENSORS * b * heads * s_q * s_k * st


def check_fits_host(pred: dict[str, Any], nproc: int, backend: str, what: str = "the plan") -> None:
    """Refuse (``executor.LaunchError``, before any rank starts) a CPU run whose predicted
    peak memory, ``nproc`` ranks of ``max_memory_bytes`` each plus what the executor's
    attention kernel holds inside one op (``executor_attention_bytes``,
    :func:`executor_attention_bytes`), exceeds what this machine has
    (:func:`host_memory_bytes`): such a run would be killed by the kernel, or swap for
    minutes, instead of measuring anything. ``what`` names the run in the message."""
    from executor import LaunchError

    need, have = pred.get("max_memory_bytes"), host_memory_bytes()
    if backend != "gloo" or need is None or have is None:
        return
    scores = int(pred.get("executor_attention_bytes", 0))
    if (need + scores) * nproc > have:
        inside = (f" + {scores / 2**30:.2f} GiB of attention scores the executor's kernel "
                  f"materialises (5 x micro-batch x heads x s_q x s_k in fp32; a shorter "
                  f"--seq-len or a larger tp / cp shrinks it)") if scores else ""
        raise LaunchError(f"{what} needs {need / 2**30:.2f} GiB per rank (predicted){inside}, "
                          f"{(need + scores) * nproc / 2**30:.2f} GiB for {nproc} ranks; this "
                          f"machine has {have / 2**30:.2f} GiB available")


def predicted_plan(plan: Any, pred: dict[str, Any]) -> Any:
    """``plan`` with the pipeline layer split of its prediction (when the plan fixes none),
    so the executor runs the stages that were costed."""
    s = plan.strategy
    if s.layers_per_stage is not None or s.pp * s.vpp == 1:
        return plan
    return dataclasses.replace(plan, strategy=s.replace(layers_per_stage=tuple(pred["layers_per_vstage"])))


def run_plan(plan: Any, nproc: int, *, cluster: Any = None, with_prediction: bool = True,
             **kwargs: Any) -> Any:
    """``executor.run_plan`` with the simulated schedule and its prediction.

    ``cluster``: the cluster the prediction uses (e.g. a calibrated YAML; default the
    plan's). ``with_prediction=False`` runs the plain schedule and predicts nothing.
    ``kwargs`` go to ``executor.run_plan`` (backend, steps, warmup, seed, timeout).
    Returns an ``executor.Measurement`` whose ``predicted`` holds :func:`predict`'s dict."""
    from executor import run_plan as _run

    if not with_prediction:
        return _run(plan, nproc, schedule=plain_schedule(plan), **kwargs)
    pred, sched = predict(plan, cluster)
    check_fits_host(pred, nproc, kwargs.get("backend", "gloo"))
    return _run(predicted_plan(plan, pred), nproc, schedule=sched, predictor=lambda _p: pred, **kwargs)


def run_plans(plans: list[Any], nproc: int, *, cluster: Any = None, with_prediction: bool = True,
              **kwargs: Any) -> list[Any]:
    """Several plans of one world size in one launch (``executor.run_plans``), each with
    its simulated schedule and prediction as in :func:`run_plan`."""
    from executor import run_plans as _run

    if with_prediction:
        pairs = [predict(p, cluster) for p in plans]
        for pred, _ in pairs:
            check_fits_host(pred, nproc, kwargs.get("backend", "gloo"))
        plans = [predicted_plan(p, pred) for p, (pred, _) in zip(plans, pairs, strict=True)]
    else:
        pairs = [({}, plain_schedule(p)) for p in plans]
    out = _run(plans, nproc, schedules=[s for _, s in pairs], **kwargs)
    for meas, (pred, _) in zip(out, pairs, strict=True):
        meas.predicted = dict(pred)
    return out


def verify(plan: Any, nproc: int, predicted: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """``executor.verify`` with the plan's registered schedule (``kwargs``: steps, seed,
    rtol, backend, adam_epsilon), after the host check (:func:`check_fits_host`) of its
    ranks (``predicted``: the plan's :func:`predict` dict when the caller has it, e.g. from
    its measured run) and of its one-process reference, which runs the whole global batch
    unpartitioned in this process (``completion.plan_program.single_process_strategy``).
    Returns an ``executor.VerifyResult``; raises ``executor.LaunchError`` before anything
    runs when either does not fit."""
    from executor import verify as _verify

    backend = kwargs.get("backend", "gloo")
    check_fits_host(predicted if predicted is not None else predict(plan)[0], nproc, backend)
    check_fits_host(predict(reference_plan(plan))[0], 1, backend, "verify's one-process reference")
    return _verify(plan, nproc, schedule=plain_schedule(plan), **kwargs)


def reference_plan(plan: Any) -> Any:
    """``plan`` as ``verify``'s one-process reference runs it: its model unpartitioned on
    one rank, the global batch one micro-batch (a given program keeps its batch;
    ``completion.plan_program.single_process_strategy``)."""
    import warnings

    from completion.models.source import resolve_model
    from completion.plan_program import single_process_strategy

    with warnings.catch_warnings():  # the plan's own costing shows the model's warnings
        warnings.simplefilter("ignore")
        source = resolve_model(plan.model, plan.seq_len, num_layers=plan.num_layers)
    return dataclasses.replace(plan, strategy=single_process_strategy(plan.strategy, source),
                               annotations={})


def verify_many(plans: list[Any], nproc: int, **kwargs: Any) -> list[Any]:
    """``executor.verify_many`` (one launch) with each plan's registered schedule."""
    from executor import verify_many as _verify_many

    return _verify_many(plans, nproc, schedules=[plain_schedule(p) for p in plans], **kwargs)


def run_repeated(plan: Any, nproc: int, repeats: int, *, cluster: Any = None,
                 **kwargs: Any) -> list[Any]:
    """``repeats`` independent measurements of ``plan`` in one launch (``executor.run_plans``:
    each repeat starts from the same parameters and data, so each is the same run), all
    with the one simulated schedule and prediction of :func:`predict`; ``kwargs`` go to
    ``executor.run_plans`` (backend, steps, warmup, seed, timeout). Raises ValueError for
    ``repeats`` < 1, and what :func:`run_plan` raises."""
    from executor import run_plans as _run

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MeshplanError(f"repeats must be an integer >= 1, got {repeats!r}")
    pred, sched = predict(plan, cluster)
    check_fits_host(pred, nproc, kwargs.get("backend", "gloo"))
    run = predicted_plan(plan, pred)
    out = _run([run] * repeats, nproc, schedules=[sched] * repeats, **kwargs)
    for meas in out:
        meas.predicted = dict(pred)
    return out
