"""The issue-43 fuzz run: generated inputs over every entry point, counting tracebacks,
hangs and silent acceptances of invalid input (results in benchmarks/RESULTS.md).

Three parts, all in this process (``meshplan.cli.main``), each input under a wall-clock
alarm (a hang is one that runs past it):

1. **plans** (``tests/_entry_points.py``): a generated plan, valid or not, through the
   Python API (Strategy + Engine), a plan.json and the CLI flags; the three must give the
   same answer (an input one accepts and another refuses is a silent acceptance), and a
   refusal must be one ``error:`` line.
2. **hostile** (``tests/_hostile.py``): inputs of every fault kind the hunt found (repeated
   options, YAML 1.1 scalars, deep nesting, bad storage paths, existing or misnamed
   outputs, unknown torchtitan sections, DeepSpeed nulls, sequences past a position
   table, huge process ids, Partial parameters, tp not dividing heads, options without
   effect, processes beyond the cores, an FP8 peak below BF16): each must be refused in
   one line naming its fault, touching no file it must not.
3. **torn journals**: a tune journal cut at a random byte, given a partial record, or with
   a record merged onto a torn line (as an older meshplan wrote); rerunning the tune must
   resume (exit 0), keep every trial whose records are whole, and write one history row
   per plan.

Usage: ``python -m benchmarks.fuzz_entry_points [--plans N] [--per-kind N] [--journals N]
[--seed S]``; prints one line per part and kind and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: seconds an input may run before it counts as a hang
ALARM_S = 300


class Hang(Exception):
    """An input ran past :data:`ALARM_S`."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _timed(fn: Any) -> tuple[Any, float]:
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    t0 = time.monotonic()
    try:
        return fn(), time.monotonic() - t0
    finally:
        signal.alarm(0)


def run_plans(n: int, seed: int, tally: Counter) -> None:
    """Part 1: ``n`` generated plans through the three entry points."""
    from hypothesis import HealthCheck, Phase, given, settings

    from tests._entry_points import as_the_cli_reads_it, plans, via_api, via_flags, via_plan_file

    folder = Path(tempfile.mkdtemp(prefix="fuzz-plans-"))
    fails: list[Any] = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(p=plans())
    def one(p: dict[str, Any]) -> None:
        try:
            (api, plan, flags), _ = _timed(lambda: (via_api(p), via_plan_file(p, folder), via_flags(p)))
            cli_api = via_api(as_the_cli_reads_it(p))
        except Hang:
            tally["plans hang"] += 1
            return
        tally["plans inputs"] += 3
        tally[f"plans {api}"] += 1
        if plan.startswith("fault") or flags.startswith("fault"):
            tally["plans traceback"] += 1
            fails.append((p, plan, flags))
        elif api != plan or cli_api != flags:
            tally["plans silent"] += 1
            fails.append((p, api, plan, cli_api, flags))

    import os

    os.environ.setdefault("HYPOTHESIS_SEED", str(seed))
    one()
    for f in fails[:5]:
        print("  plan fault:", json.dumps(f, default=str)[:600])


def run_hostile(per_kind: int, seed: int, tally: Counter) -> None:
    """Part 2: ``per_kind`` inputs of every hostile kind."""
    import os

    from tests._entry_points import run_cli
    from tests._hostile import KINDS, check

    rng = random.Random(seed)
    for kind, make in sorted(KINDS.items()):
        bad = Counter()
        for _ in range(per_kind):
            folder = Path(tempfile.mkdtemp(prefix="fuzz-hostile-"))
            cwd, err = os.getcwd(), ""
            os.chdir(folder)
            try:
                case = make(rng, folder)
                before = {p: p.read_bytes() for p in case.untouched}
                (rc, out, err), _ = _timed(lambda c=case: run_cli(c.argv))
                why = check(case, rc, out, err, before)
            except Hang:
                why = "hang"
            finally:
                os.chdir(cwd)
                shutil.rmtree(folder, ignore_errors=True)
            tally["hostile inputs"] += 1
            if why:
                bad[why] += 1
                tally[f"hostile {why}"] += 1
                print(f"  {kind}: {why}: {case.argv} -> {err.strip().splitlines()[-1:]}")
        print(f"{kind}: {per_kind} inputs, {sum(bad.values())} wrong {dict(bad)}", flush=True)


TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--study", "f", "--sampler", "random"]


def _finished(journal: Path) -> dict[int, tuple]:
    import optuna

    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    try:
        s = optuna.load_study(study_name="f", storage=st)
    except (KeyError, ValueError):
        return {}
    return {t.number: (t.state.name, t.params) for t in s.get_trials(deepcopy=False) if t.state.is_finished()
            and t.state.name != "FAIL"}


def run_journals(n: int, seed: int, tally: Counter) -> None:
    """Part 3: ``n`` torn journals, each resumed by the same tune command."""
    import warnings

    import optuna
    import pandas as pd

    from tests._entry_points import run_cli

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    import subprocess

    rng = random.Random(seed)
    seed_dir = Path(tempfile.mkdtemp(prefix="fuzz-journal-"))
    # in a process of its own, as a search that crashed: its RUNNING trials have a dead owner
    r = subprocess.run([sys.executable, "-m", "meshplan", *TUNE, "--trials", "6", "--output",
                        str(seed_dir / "run")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    data = (seed_dir / "run" / "journal.log").read_bytes()
    lines = data.splitlines(keepends=True)
    for _ in range(n):
        d = Path(tempfile.mkdtemp(prefix="fuzz-torn-"))
        shutil.copytree(seed_dir / "run", d / "run")
        journal = d / "run" / "journal.log"
        how = rng.choice(["cut", "partial", "merged"])
        if how == "cut":
            journal.write_bytes(data[:rng.randint(len(lines[0]) + len(lines[1]) + 1, len(data) - 1)])
        elif how == "partial":
            k = rng.randrange(len(lines))
            journal.write_bytes(data + lines[k][:rng.randint(1, len(lines[k]) - 2)])
        else:  # an older meshplan appended record k onto a torn start of another record
            k = rng.randrange(3, len(lines))
            torn = lines[k - 1][:rng.randint(1, len(lines[k - 1]) - 2)]
            journal.write_bytes(b"".join(lines[:k] + [torn + lines[k]] + lines[k + 1:]))
        whole = journal.read_bytes()
        (d / "given.log").write_bytes(whole)  # the torn journal as given, kept on a failure
        ref = d / "ref.log"  # the whole records: what Optuna alone reads of them
        ref.write_bytes(whole[:whole.rfind(b"\n") + 1] if how != "merged" else data)
        before = _finished(ref)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (rc, out, err), _ = _timed(lambda d=d: run_cli([*TUNE, "--trials", "8", "--output",
                                                                str(d / "run")]))
        except Hang:
            tally["journals hang"] += 1
            continue
        tally["journals inputs"] += 1
        try:
            after = _finished(journal)
        except ValueError as e:  # Optuna alone cannot read the journal the resume left
            tally["journals unreadable"] += 1
            print(f"  torn journal ({how}): exit {rc}, Optuna cannot read it after: {e}; "
                  f"{err.strip()[-300:]}")
            shutil.copytree(d, Path(tempfile.gettempdir()) / f"fuzz-unreadable-{rng.randrange(10**6)}")
            continue
        rows = len(pd.read_csv(d / "run" / "history.csv")) if rc == 0 else -1
        if "Traceback" in out + err or rc != 0:
            tally["journals traceback" if "Traceback" in out + err else "journals not resumable"] += 1
            print(f"  torn journal ({how}): exit {rc}: {err.strip()[-300:]}")
        elif any(after.get(k) != v for k, v in before.items()):
            tally["journals lost"] += 1
            print(f"  torn journal ({how}): a finished trial was lost or changed")
        elif sum(v[0] in ("COMPLETE", "PRUNED") for v in after.values()) < 8 or rows < 8:
            tally["journals short"] += 1
            print(f"  torn journal ({how}): {len(after)} finished, {rows} history rows")
        shutil.rmtree(d, ignore_errors=True)
    print(f"torn journals: {n} resumed, {sum(v for k, v in tally.items() if k.startswith('journals ') and k != 'journals inputs')} wrong")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=400)
    ap.add_argument("--per-kind", type=int, default=40)
    ap.add_argument("--journals", type=int, default=24)
    ap.add_argument("--seed", type=int, default=43)
    a = ap.parse_args(argv)
    tally: Counter = Counter()
    t0 = time.monotonic()
    run_hostile(a.per_kind, a.seed, tally)
    run_journals(a.journals, a.seed, tally)
    run_plans(a.plans, a.seed, tally)
    inputs = tally["plans inputs"] + tally["hostile inputs"] + tally["journals inputs"]
    bad = {k: v for k, v in tally.items() if not k.endswith(("inputs", "accepted", "refused"))}
    print(json.dumps({"inputs": inputs, "seconds": round(time.monotonic() - t0), **dict(tally)}, indent=1))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
