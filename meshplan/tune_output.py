"""What ``meshplan tune`` leaves behind and says (the search itself: ``meshplan.tuning``,
``tuner.search``): ``history.csv``, ``report.txt`` (counts, the answer and its gap, the top
plans, why the best won, ``tuner.explain``) and ``plan.json`` with what the search knew of
it (:func:`search_facts`), the ``best plan:`` line (:func:`best_line`) and ``tune --json``'s
one object (:func:`json_answer`). :func:`finish` writes them all. The command:
``meshplan.commands.tune``.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

from meshplan import goodput_inputs as gi
from meshplan.errors import MeshplanError
from meshplan.terminal import echo
from meshplan.tune_sizes import step_of


def default_study(cfg_dict: dict, model: str, mode: str) -> str:
    """``MODEL-MODE-HASH`` in the safe study-name characters (tuner.study.STUDY_NAME)."""
    h = hashlib.sha1(json.dumps(cfg_dict, sort_keys=True).encode()).hexdigest()[:8]
    safe = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-_." else "_"
                   for ch in Path(model).name).lstrip(".")[:80] or "model"
    return f"{safe}-{mode}-{h}"


def _ann(c) -> str:
    if c.tp == 1:
        return "- (tp=1, nothing sharded inside a rank)"
    if c.annotation_seed is not None:
        return f"full_random seed {c.annotation_seed}"
    t = {k: v for k, v in c.template_dict().items() if k != "loss"}
    return ",".join(f"{k}={v}" for k, v in sorted(t.items())) or c.annotation


def report_text(result, study: str, storage: str, k: int, width: int = 200) -> str:
    """Counts and the top-plans table as text ``width`` columns wide (report.txt: 200; the
    terminal: its width, ``meshplan.terminal.width``)."""
    from rich.console import Console

    from tuner.result import top_table

    con = Console(record=True, width=width, file=io.StringIO())
    con.print(f"study {study} ({storage}): {result.counts_text()}")
    if result.exhaustive is not None:
        con.print(result.exhaustive.summary())
    if result.bound_gap is not None:
        con.print(result.bound_gap.summary())
    from simulator.step import MFU_NOTE

    if result.answer is not None:
        con.print(f"answer: {result.answer.summary()}")
    con.print(top_table(result, k, None if width >= 200 else width))
    con.print(MFU_NOTE.split(" (--json")[0])  # the convention of the table's and history.csv's mfu
    return con.export_text()


def search_facts(result: Any, rec: Any = None) -> dict[str, Any]:
    """What a search knew of its answer (plan.json's ``search``, ``tune --json``): the
    predicted step and peak memory of the plan (``rec``: its record), the answer's proof
    status and gap (``tuner.gap.SearchAnswer``, without its per-shape bounds) and the trial
    counts."""
    out: dict[str, Any] = {}
    if rec is not None:
        out.update(step_time_s=step_of(rec), peak_memory_bytes=int(rec["memory_bytes"]),
                   memory_limit_bytes=int(rec["memory_limit_bytes"]))
    if result.answer is not None:
        ans = result.answer.to_dict()
        ans.pop("shapes", None)
        out.update(ans)
    out["trials"] = result.counts()
    if result.exhaustive is not None:
        ex = result.exhaustive
        out["candidates"] = {"space": ex.space_size, "simulated": ex.simulated, "resumed": ex.resumed,
                             "refused": ex.refused, "pruned_memory": ex.pruned_memory,
                             "pruned_time": ex.pruned_time, "pruned_cheap": ex.pruned_cheap,
                             "open": ex.open}
    return out


def finish(result, cfg, study: str, storage: str, out: Path, top: int,
            max_step_time: float | None = None, deadline_s: float | None = None, as_json: bool = False,
            quiet: bool = False) -> bool:
    """Write history.csv, report.txt and plan.json (into ``out``, which exists) and print the report (``as_json``: one
    JSON object instead, :func:`json_answer`; ``quiet``: nothing); True when a feasible
    plan was found and meets ``max_step_time`` and ``deadline_s`` (seconds to train, a run
    objective's), when given."""
    from meshplan.tuning import to_plan
    from tuner.explain import why_best

    result.write_history_csv(out / "history.csv")
    from meshplan import terminal

    text = report_text(result, study, storage, top)
    say = (lambda *_a, **_k: None) if as_json or quiet else echo
    say(report_text(result, study, storage, top, terminal.width()))
    best = result.best()
    why = "\n".join(why_best(result))  # why it won, or which constraint bound
    if best is None:
        (out / "report.txt").write_text(text + "\nno feasible plan found\n" + why + "\n")
        say(f"no feasible plan found\n{why}")
        if as_json:
            echo(json.dumps(json_answer(result, None, None, study, out), sort_keys=True))
        return False
    cand, rec = best
    # the simulated step (a run objective scores time_s per step: meshplan.objective_scoring)
    step = step_of(rec)
    plan = to_plan(cand, cfg.scorer_config)
    from dataclasses import replace

    plan = replace(plan, search=search_facts(result, rec))
    plan.save(out / "plan.json")
    line = best_line(plan, cand, rec, cfg)
    note, late = gi.run_note(rec, deadline_s)  # --objective time-to-train, cost-to-train, p90
    line += note
    missed = max_step_time is not None and step > max_step_time
    if missed:
        line += (f"; misses --max-step-time {max_step_time} s by {step - max_step_time:.3f} s "
                 f"(the fastest plan found)")
    missed = missed or late
    (out / "report.txt").write_text(text + "\n" + line + "\n" + why + "\n")
    say(line)
    say(why)
    say(f"wrote {out / 'plan.json'}, {out / 'history.csv'}, {out / 'report.txt'}")
    if as_json:
        echo(json.dumps(json_answer(result, plan, rec, study, out), sort_keys=True))
    return not missed


def best_line(plan: Any, cand: Any, rec: Any, cfg: Any) -> str:
    """The report's ``best plan:`` line: the strategy, its step and peak, and its cost."""
    from clusters.spec import DEFAULT_MEMORY_HEADROOM
    from tuner.sizing import gpu_hours_per_mtok

    s = plan.strategy
    line = (f"best plan: dp={s.dp} tp={s.tp} pp={s.pp} cp={s.cp} " + (f"ep={s.ep} " if s.ep > 1 else "") + (f"etp={s.etp} " if s.etp not in (None, s.tp) else "")
            + f"vpp={s.vpp} {s.schedule} "
            f"mbs={s.micro_batch_size} recompute={s.recompute} zero={s.zero} "
            + (f"fsdp_shard_size={s.fsdp_shard_size} " if s.fsdp_shard_size else "")
            + (f"fp8={s.fp8} " if s.fp8 else "") +
            f"sp={s.sequence_parallel} annotation={_ann(cand)} framework={s.framework}: "
            f"step {step_of(rec) * 1e3:.1f} ms, peak {rec['memory_bytes'] / 2**30:.1f} GiB "
            f"of {rec['memory_limit_bytes'] / 2**30:.1f} GiB (usable memory less "
            f"{cfg.scorer_config.get('memory_headroom', DEFAULT_MEMORY_HEADROOM):.0%} headroom)")
    p = cfg.space.problem
    cost = gpu_hours_per_mtok(step_of(rec), s.dp * s.cp * s.tp * s.pp, p.global_batch_size * p.seq_len)
    return line + f"; {cost:.4f} GPU-h per million tokens"


def json_answer(result: Any, plan: Any, rec: Any, study: str, out: Path) -> dict[str, Any]:
    """``tune --json``: one object with the plan (``Plan.to_dict``, None: nothing fits),
    its predicted step (s) and peak memory (bytes), the proof status and gap, and the
    search counts (:func:`search_facts`), the study and the output folder."""
    facts = search_facts(result, rec)
    from dataclasses import replace

    return {"plan": None if plan is None else replace(plan, search=None).to_dict(),
            "study": study, "output": str(out),
            "step_time_s": facts.pop("step_time_s", None),
            "peak_memory_bytes": facts.pop("peak_memory_bytes", None),
            "memory_limit_bytes": facts.pop("memory_limit_bytes", None), "search": facts}


def checked_output(cfg: Any, names: tuple[str, str], study: str | None, output: str | None,
                    storage: str | None, seed_from_bound: int | None, objective: str,
                    max_step_time: float | None, gpus: str | None, nodes: int | None,
                    cluster: str, force: bool = False) -> tuple[str, Path, str | None]:
    """The study name and output folder of a search, after every refusal that needs no
    search (so that a refused command line leaves no folder behind): ``--seed-from-bound``
    with the sampler, ``--sampler exhaustive`` with ``--pareto``, ``--objective`` /
    ``--max-step-time`` without ``--gpus``, ``--gpus`` with ``--nodes`` or a size the
    cluster cannot take. Makes the folder (or the journal's) unless the storage is a
    database or in memory. ``names``: (MODEL as given, the mode's name) for the default
    study name. Returns (study name, folder, the note of ``meshplan.tune_notes.other_studies``
    or None). Raises MeshplanError (or the tuner's own error) naming the option."""
    from meshplan.outputs import check_tune_output, ensure_dir
    from meshplan.tune_notes import other_studies
    from meshplan.tune_sizes import check_single, check_sizes
    from tuner.bound_seed import check_seed_option
    from tuner.search import MEMORY, check_exhaustive
    from tuner.study import check_study_name

    check_seed_option(cfg.sampler_name, seed_from_bound)
    if cfg.sampler_name == "exhaustive":
        check_exhaustive(cfg)
    check_single(objective, max_step_time)
    if gpus is not None and nodes is not None:  # each size sets its own node count
        raise MeshplanError(f"--gpus {gpus} sets the node count of each size; drop --nodes {nodes}")
    if gpus is not None:
        try:
            check_sizes(gpus, cluster)
        except ValueError as e:
            raise MeshplanError(str(e)) from None
    model, mode_name = names
    name = check_study_name(study) if study is not None else default_study(cfg.to_dict(), model, mode_name)
    if output is not None and not output.strip():
        raise MeshplanError("--output is empty; give a folder (default: meshplan-runs/STUDY)")
    out = Path(output) if output is not None else Path("meshplan-runs") / name
    check_tune_output("--output", out, name, force)  # another study's results: not replaced
    note = None
    if storage is None:
        ensure_dir(out)  # the journal lives there
        if gpus is None:  # with --gpus each size has a folder of its own (run_one)
            note = other_studies(out, name)
    elif storage != MEMORY and "://" not in storage:
        ensure_dir(Path(storage.removeprefix("journal:")).parent, "--storage")
    return name, out, note
