"""The torchrun entry point: ``torchrun --nnodes N --nproc-per-node G -m meshplan.executor.run
PLAN.json [--steps K] [--verify] [--profile-trace DIR]``.

One process per rank, on any number of nodes, joined by torchrun's ``env://`` rendezvous
(``executor.torchrun``; gloo on CPUs, NCCL when the process sees a GPU). Rank 0 reads the
plan, builds the schedule and the simulator's prediction (``meshplan.validation``, as
``meshplan validate`` does) and shares them; every rank runs its row; rank 0 gathers the
measurements and prints the same predicted-vs-measured table (or ``--json``) and appends the
same CSV row as ``meshplan validate``. ``--verify`` instead runs the plain schedule with the
parameters collected and compares losses and parameters with a single-process run on rank 0
(``executor.verify``), exiting 1 on a mismatch.

Failures (``executor.watchdog``): a rank that raises, dies or whose node is lost is named by
every surviving rank within ``--dead-after`` seconds; a rank that stops progressing while
the others wait for it is named as the one that hangs after ``--hang-after`` seconds. Each
surviving process then prints ``error: rank R: <verdict>`` and exits 1, so torchrun's agents
end the run. Exit codes: 0 done, 1 a failed or mismatched run, 2 bad input (the plan, the
world size, the options)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError

#: Seconds to wait, after a collective raised, for the watchdog to name the rank at fault
#: (a peer's death shows first as a broken connection on its neighbours).
VERDICT_GRACE = 2.0


def parser() -> argparse.ArgumentParser:
    """The command line of the entry point."""
    from meshplan.validation_report import DEFAULT_CSV

    p = argparse.ArgumentParser(prog="torchrun ... -m meshplan.executor.run",
                                description="Run a meshplan plan under torchrun.")
    p.add_argument("plan", help="Plan JSON (meshplan.Plan); read by rank 0 only.")
    p.add_argument("--steps", type=int, default=None, help="Measured steps (default 10; verify: 2).")
    p.add_argument("--warmup", type=int, default=2, help="Unmeasured steps first (verify: 0).")
    p.add_argument("--verify", action="store_true", help="Compare with a single-process run.")
    p.add_argument("--cluster", default="", help="Cluster YAML or name for the prediction.")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="Default: nccl when a GPU is visible, else gloo.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default=DEFAULT_CSV, help="CSV rank 0 appends a row to.")
    p.add_argument("--json", action="store_true", help="Rank 0 prints JSON.")
    p.add_argument("--collective-timeout", type=float, default=120.0,
                   help="Seconds a collective may wait (process group timeout).")
    p.add_argument("--heartbeat", type=float, default=1.0, help="Seconds between heartbeats.")
    p.add_argument("--dead-after", type=float, default=15.0,
                   help="Seconds of silence after which a rank is named dead.")
    p.add_argument("--hang-after", type=float, default=120.0,
                   help="Seconds without progress on any rank after which the hung one is named.")
    p.add_argument("--profile-trace", default=None,
                   help="Directory each rank writes the trace meshplan calibrate --from-trace "
                        "fits to (rank<R>.json): after the timed steps, 3 profiler steps (shapes) "
                        "and 31 rounds of an unrecorded and a span-recorded step.")
    p.add_argument("--progress-dir", default=None,
                   help="Directory each rank writes its progress file rank<R>.json to.")
    return p


def _check_args(a: argparse.Namespace) -> None:
    if a.steps is not None and not 1 <= a.steps <= 10_000:
        raise MeshplanError(f"--steps must be in 1..10000, got {a.steps}")
    if a.warmup < 0:
        raise MeshplanError(f"--warmup must be >= 0, got {a.warmup}")
    for name in ("collective_timeout", "heartbeat", "dead_after", "hang_after"):
        if not getattr(a, name) > 0:
            raise MeshplanError(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    if a.heartbeat >= min(a.dead_after, a.hang_after):
        raise MeshplanError("--heartbeat must be shorter than --dead-after and --hang-after")


def prepare(a: argparse.Namespace, world: int) -> tuple:
    """Rank 0's work before the run: ``("ok", plan, rows, prediction)`` or ``("error",
    message)`` for a bad plan (every rank then exits 2 with the message)."""
    from executor.run import check_plan, plan_rows
    from meshplan.plan import Plan
    from meshplan.validation import plain_schedule, predict, predicted_plan

    try:
        plan = Plan.load(a.plan)
        check_plan(plan, world)
        if a.verify:
            return "ok", plan, plan_rows(plan, plain_schedule(plan)), {}
        pred, sched = predict(plan, a.cluster or None)
        run = predicted_plan(plan, pred)
        return "ok", run, plan_rows(run, sched), pred
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        return "error", " ".join(str(msg).split()).replace("--nproc is", "WORLD_SIZE is")


def broken_collective(e: BaseException) -> bool:
    """True for the error a collective raises when a peer went away: torch.distributed's
    DistError, or gloo's plain RuntimeError ("Connection reset by peer", ...); not the
    executor's own errors (subclasses of RuntimeError with a message of their own)."""
    import torch.distributed as dist

    return isinstance(e, getattr(dist, "DistError", ())) or type(e) is RuntimeError


def _die(rank: int, message: str, code: int = 1) -> None:
    sys.stdout.flush()
    print(f"error: rank {rank}: {message}", file=sys.stderr, flush=True)
    os._exit(code)


def _report(a: argparse.Namespace, plan: Any, meas: Any) -> int:
    import json

    from meshplan.validation_report import append_csv, print_table, report_rows

    append_csv(Path(a.csv), a.plan, plan, meas)
    rows = report_rows(plan, meas)
    if a.json:
        print(json.dumps({"launcher": "torchrun", "nproc": meas.nproc, "backend": meas.backend,
                          "predicted_step_time_ms": rows[0][1], "measured_step_time_ms": rows[0][2],
                          "relative_error": meas.relative_error(), "losses": meas.losses,
                          "peak_memory_bytes": meas.peak_memory,
                          "rows": [{"quantity": q, "predicted": p, "measured": m}
                                   for q, p, m in rows]}), flush=True)
    else:
        print_table(rows)
        print(f"losses: {', '.join(f'{x:.4f}' for x in meas.losses)}", flush=True)
    return 0


def _verify_report(a: argparse.Namespace, plan: Any, meas: Any, steps: int) -> int:
    import json

    from executor.verify import VERIFY_ADAM_EPSILON, compare, reference

    res = compare(meas, reference(plan, steps, a.seed, VERIFY_ADAM_EPSILON))
    if a.json:
        print(json.dumps({"launcher": "torchrun", "nproc": meas.nproc, "ok": res.ok,
                          "loss_error": res.loss_error, "losses": res.losses,
                          "reference_losses": res.reference_losses,
                          "worst_parameter": list(res.worst)}), flush=True)
    else:
        print(f"verify on {meas.nproc} ranks ({meas.backend}): {res.summary()}", flush=True)
    return 0 if res.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run under torchrun (see the module docstring); returns the exit code (failures of
    other ranks end the process from the watchdog thread with exit code 1)."""
    from executor import LaunchError
    from executor.torchrun import init_from_env, run_rank, share, start_watchdog
    from executor.verify import VERIFY_ADAM_EPSILON

    a = parser().parse_args(argv)
    try:
        _check_args(a)
        env = init_from_env(a.backend, a.collective_timeout)
    except (ValueError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.progress_dir:
        os.makedirs(a.progress_dir, exist_ok=True)
    dog = start_watchdog(env, lambda msg: _die(env.rank, msg), a.heartbeat, a.dead_after,
                         a.hang_after, a.progress_dir)
    job = share(prepare(a, env.world_size) if env.rank == 0 else None, env)
    if job[0] == "error":
        dog.stop("refused")
        if env.rank == 0:
            print(f"error: {job[1]}", file=sys.stderr)
        return 2
    _, plan, rows, pred = job
    steps, warmup = (a.steps or 2, 0) if a.verify else (a.steps or 10, a.warmup)
    try:
        meas = run_rank(env, plan, rows, steps, warmup, a.seed, params=a.verify,
                        adam_epsilon=VERIFY_ADAM_EPSILON if a.verify else None, watchdog=dog,
                        profile_dir=None if a.verify else a.profile_trace)
    except Exception as e:  # noqa: BLE001 - named to every rank, then the process ends
        message = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        deadline = time.monotonic() + a.dead_after + VERDICT_GRACE
        if broken_collective(e):  # a peer's death seen from here: let the watchdog name it
            while dog.verdict is None and time.monotonic() < deadline:
                time.sleep(a.heartbeat / 4)
        try:
            dog.fail(message)
        finally:
            _die(env.rank, f"failed: {message}")
    dog.stop()
    import torch.distributed as dist

    dist.barrier()  # every rank has stopped watching before rank 0 (the store's host) leaves
    code = 0
    if env.rank == 0:
        if a.verify:
            code = _verify_report(a, plan, meas, steps)
        else:
            meas.predicted = dict(pred)
            code = _report(a, plan, meas)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo's teardown may abort in C++ destructors after the work is done


if __name__ == "__main__":
    sys.exit(main())
