"""Fuzz the input boundary (issue 16): mutated PIR programs, cluster YAMLs, plan JSONs and
``meshplan`` command lines.

Seeds: ``shared/data/programs/*.pir``, ``clusters/catalog/*.yaml``,
``benchmarks/plans/*.json`` and valid argument lists of ``cost``, ``simulate``, ``tune
--trials 1 --storage memory`` and ``complete``. Each input runs under a per-input deadline
(SIGALRM in the main thread, a watchdog thread elsewhere) and must end in one of:

* accepted (a Program, a cluster, a Plan, exit code 0);
* refused with the package's error type (CompletionError for program text,
  ClusterSpecError / ClusterError for cluster files, PlanError for plans, a ValueError of
  the cost model for a plan that is costed) or, on the command line, exit code 1 / 2 and
  an ``error: ...`` line (``Error: ...`` for click's usage errors) -- never a traceback.

Some mutations are invalid by construction -- a type whose mesh_shape or dims_mappings
disagree with the dist attrs, a known op with an operand removed, a YAML number written
as a string or a boolean, a size beyond its documented bound, an unsafe study name -- and
must be refused: accepting one silently fails the run.

Size: bounded for CI (``DEFAULT_INPUTS`` inputs, a few seconds); ``MESHPLAN_FUZZ=N`` runs N
inputs (mixed over the kinds), ``MESHPLAN_FUZZ_SEED`` picks the random stream,
``MESHPLAN_FUZZ_TIMEOUT`` the per-input deadline (s), ``MESHPLAN_FUZZ_REPORT=FILE``
writes the counts as JSON (the long run recorded in benchmarks/RESULTS.md) and
``MESHPLAN_FUZZ_TRACE=FILE`` logs each input before it runs.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((SHARED / "data" / "programs").glob("*.pir"))
CLUSTERS = sorted((ROOT / "clusters" / "catalog").glob("*.yaml"))
PLANS = sorted((ROOT / "benchmarks" / "plans").glob("*.json"))

#: inputs of the bounded CI run (a few seconds)
DEFAULT_INPUTS = 120
N_INPUTS = int(os.environ.get("MESHPLAN_FUZZ", "0") or 0) or DEFAULT_INPUTS
SEED = int(os.environ.get("MESHPLAN_FUZZ_SEED", "0"))
TIMEOUT_S = float(os.environ.get("MESHPLAN_FUZZ_TIMEOUT", "60"))
REPORT = os.environ.get("MESHPLAN_FUZZ_REPORT")
#: append each input (kind, mutation, payload head) to this file before running it
TRACE = os.environ.get("MESHPLAN_FUZZ_TRACE")
#: share of the inputs per kind (command lines are the slow ones: up to ~2 s each)
WEIGHTS = {"pir": 0.3, "yaml": 0.25, "plan": 0.25, "cli": 0.2}

INTERESTING_INTS = [0, -1, 1, 2, 3, 7, 64, 65537, 2**31, 2**63, 10**9, 10**20, -(10**9)]
INTERESTING_STRS = ["", "x", "1e9", "8", "-1", "nan", "inf", "1e308", "true", "null", "../../x",
                    "é", "a" * 300, "[0,1]", "{}", "\x00"]


class Deadline(BaseException):
    """Raised in the input's code when its deadline passes (not an Exception: code under
    test cannot swallow it)."""


@dataclass
class Case:
    """One fuzz input: ``kind`` (pir, yaml, plan, cli), a label of the mutation, the
    payload, and ``must_refuse`` (why, when the mutation is invalid by construction)."""

    kind: str
    mutation: str
    payload: object
    must_refuse: str = ""


# -- running one input ------------------------------------------------------------------------

def run_with_deadline(fn: Callable[[], object], timeout: float) -> tuple[str, object]:
    """``("ok", value)``, ``("raised", exception)`` or ``("timeout", None)``."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def on_alarm(signum, frame):
            raise Deadline()

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return "ok", fn()
        except Deadline:
            return "timeout", None
        except Exception as e:  # noqa: BLE001 - classified by the caller
            return "raised", e
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    box: dict[str, tuple[str, object]] = {}

    def target():
        try:
            box["r"] = ("ok", fn())
        except Exception as e:  # noqa: BLE001
            box["r"] = ("raised", e)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    return box.get("r", ("timeout", None))


# -- PIR programs --------------------------------------------------------------------------

def _signature_operand_types(line: str) -> tuple[int, int] | None:
    """Span of the operand type list ``: (...) ->`` of one op line."""
    m = re.search(r"\} : \((.*)\) -> ", line)
    return (m.start(1), m.end(1)) if m else None


def _mutate_pir(rng: random.Random, text: str) -> Case:
    lines = text.split("\n")
    typed = [i for i, ln in enumerate(lines) if "mesh_shape:[" in ln]
    op = rng.choice(["mesh_shape", "operand_dims", "arity", "int", "delete", "insert", "dup_line",
                     "swap_lines", "truncate", "attr_key"])
    if op == "mesh_shape" and typed:
        i = rng.choice(typed)
        occ = [m for m in re.finditer(r"mesh_shape:\[([0-9,]+)\]", lines[i])]
        m = rng.choice(occ)
        new = rng.choice(["3", "4", "2,2", "1", "65537", "0"])
        if new != m.group(1):
            lines[i] = lines[i][:m.start(1)] + new + lines[i][m.end(1):]
            return Case("pir", op, "\n".join(lines), "a type's mesh_shape disagrees with the dist attrs")
    if op == "operand_dims" and typed:
        cands = []
        for i in typed:
            span = _signature_operand_types(lines[i])
            if span:
                for m in re.finditer(r"dims_mappings:\[([-0-9,]+)\]", lines[i][span[0]:span[1]]):
                    cands.append((i, span[0] + m.start(1), span[0] + m.end(1), m.group(1)))
        if cands:
            i, a, b, dims = rng.choice(cands)
            vals = dims.split(",")
            j = rng.randrange(len(vals))
            vals[j] = "0" if vals[j] == "-1" else "-1"
            lines[i] = lines[i][:a] + ",".join(vals) + lines[i][b:]
            return Case("pir", op, "\n".join(lines),
                        "an operand type's dims_mappings disagree with its value's definition")
    if op == "arity":
        cands = [i for i, ln in enumerate(lines)
                 if re.search(r'"pd_op\.(matmul|subtract|matmul_grad|relu_grad|subtract_grad|sgd_)" \(%\d+, ', ln)]
        if cands:
            i = rng.choice(cands)
            drop_type = rng.random() < 0.5
            lines[i] = re.sub(r'(" \()%\d+, ', r"\1", lines[i], count=1)
            if drop_type:
                span = _signature_operand_types(lines[i])
                if span:
                    inner = lines[i][span[0]:span[1]]
                    parts = re.split(r", (?=pd_dist\.tensor|tensor|<<NULL)", inner)
                    lines[i] = lines[i][:span[0]] + ", ".join(parts[1:]) + lines[i][span[1]:]
            return Case("pir", op + ("+type" if drop_type else ""), "\n".join(lines),
                        "a known op lost an operand (wrong arity)")
    text2 = "\n".join(lines)
    if op == "int":
        nums = list(re.finditer(r"-?\d+", text2))
        if nums:
            m = rng.choice(nums)
            text2 = text2[:m.start()] + str(rng.choice(INTERESTING_INTS)) + text2[m.end():]
    elif op == "delete":
        a = rng.randrange(len(text2))
        text2 = text2[:a] + text2[a + rng.randint(1, 40):]
    elif op == "insert":
        a = rng.randrange(len(text2))
        junk = "".join(rng.choice("[]{}(),:%\"-0123456789x<>=. \n\\pd_op") for _ in range(rng.randint(1, 8)))
        text2 = text2[:a] + junk + text2[a:]
    elif op == "dup_line":
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        text2 = "\n".join(lines)
    elif op == "swap_lines" and len(lines) > 2:
        i, j = rng.sample(range(len(lines)), 2)
        lines[i], lines[j] = lines[j], lines[i]
        text2 = "\n".join(lines)
    elif op == "truncate":
        text2 = text2[:rng.randrange(len(text2))]
    elif op == "attr_key":
        keys = list(re.finditer(r"\b(dims_maping|process_ids|shape|transpose_x|stop_gradient)\b", text2))
        if keys:
            m = rng.choice(keys)
            text2 = text2[:m.start()] + rng.choice(["dims_mapping", "procs", "shap", "chunk_id", ""]) + text2[m.end():]
    return Case("pir", op, text2)


def _check_pir(case: Case) -> str:
    from completion.completer import Completer
    from completion.errors import CompletionError
    from completion.pir import parse_program, print_program

    def go():
        prog = parse_program(case.payload)
        again = parse_program(print_program(prog))  # what we print, we read back
        if any(v.dist_attr is not None for v in again.values()):
            Completer(again).complete()
        return prog

    return _classify(case, run_with_deadline(go, TIMEOUT_S), (CompletionError,))


# -- cluster YAML --------------------------------------------------------------------------

def _numeric_paths(data, path=()) -> Iterator[tuple]:
    if isinstance(data, dict):
        if "value" in data and isinstance(data["value"], (int, float)) and not isinstance(data["value"], bool):
            yield path
        for k, v in data.items():
            yield from _numeric_paths(v, (*path, k))


def _all_paths(data, path=()) -> Iterator[tuple]:
    yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _all_paths(v, (*path, k))


def _get(data, path):
    for k in path:
        data = data[k]
    return data


def _mutate_yaml(rng: random.Random, data: dict) -> Case:
    d = copy.deepcopy(data)
    op = rng.choice(["string_number", "bool_number", "value", "delete", "unknown", "world", "text",
                     "nested", "type"])
    if op in ("string_number", "bool_number"):
        path = rng.choice(list(_numeric_paths(d)))
        node = _get(d, path)
        if op == "string_number":
            node["value"] = rng.choice(["1e9", str(node["value"]), "8", "2.3e+11", " 5 "])
            why = "a YAML number written as a string"
        else:
            node["value"] = rng.choice([True, False])
            why = "a YAML number written as a boolean"
        return Case("yaml", op, yaml.safe_dump(d), why)
    if op == "world":
        d["cluster"]["num_nodes"]["value"] = rng.choice([2**20, 10**9, 2**40])
        return Case("yaml", op, yaml.safe_dump(d), "more ranks than MAX_WORLD_SIZE")
    paths = [p for p in _all_paths(d) if p]
    path = rng.choice(paths)
    parent, key = _get(d, path[:-1]), path[-1]
    if op == "value":
        parent[key] = rng.choice([*INTERESTING_INTS, *INTERESTING_STRS, 1e308, float("inf"),
                                  float("nan"), -0.5, None, [], {}, [1, 2], {"value": 1}])
    elif op == "delete":
        del parent[key]
    elif op == "unknown":
        parent[f"{key}_x"] = {"value": 1, "provenance": "fuzz"}
    elif op == "nested":
        parent[key] = "@@DEEP@@"
    elif op == "type":
        parent[key] = str(parent[key]) if not isinstance(parent[key], str) else 12
    text = yaml.safe_dump(d, width=10**6)
    if op == "nested":
        n = rng.choice([3, 50, 500, 20000])
        text = text.replace("'@@DEEP@@'", "[" * n + "1" + "]" * n)
    if op == "text":
        a = rng.randrange(len(text))
        text = text[:a] + rng.choice(["", ":", "- ", "{", "&a ", "*a", "\t", "!!python/object:os.system ''"]) + text[a + rng.randint(0, 10):]
    return Case("yaml", op, text)


def _check_yaml(case: Case, tmp: Path) -> str:
    from clusters import ClusterError, load_cluster

    p = tmp / "fuzz_cluster.yaml"
    p.write_text(case.payload)
    return _classify(case, run_with_deadline(lambda: load_cluster(str(p)), TIMEOUT_S), (ClusterError,))


# -- plan JSON -----------------------------------------------------------------------------

#: plan / strategy fields and a value beyond each one's documented bound
UNBOUNDED = {("seq_len",): 10**9, ("nodes",): 10**7, ("num_layers",): 10**6,
             ("strategy", "global_batch_size"): 10**9, ("strategy", "micro_batch_size"): 10**9,
             ("strategy", "dp"): 2**21, ("strategy", "tp"): 2**21, ("strategy", "pp"): 2**21,
             ("strategy", "vpp"): 10**4}


def _mutate_plan(rng: random.Random, data: dict) -> Case:
    d = copy.deepcopy(data)
    op = rng.choice(["unbounded", "value", "delete", "unknown", "nested", "text", "strategy_value",
                     "huge_int"])
    if op == "unbounded":
        path, val = rng.choice(list(UNBOUNDED.items()))
        _get(d, path[:-1])[path[-1]] = val * rng.choice([1, 10, 10**6])
        return Case("plan", op, json.dumps(d), f"{'.'.join(path)} beyond its bound")
    if op == "nested":
        depth = rng.choice([20, 500, 100000])
        where = rng.choice(["annotations", "model", "strategy"])
        return Case("plan", op, json.dumps(d)[:-1] + f', "{where}x": ' + "[" * depth + "]" * depth + "}",
                    "JSON nested deeper than MAX_JSON_DEPTH")
    if op == "huge_int":
        text = json.dumps(d).replace('"seq_len": 128', '"seq_len": ' + "9" * rng.choice([30, 5000]))
        return Case("plan", op, text, "an integer beyond every bound" if "9999" in text else "")
    if op in ("value", "strategy_value"):
        target = d["strategy"] if op == "strategy_value" else d
        key = rng.choice(list(target))
        target[key] = rng.choice([*INTERESTING_INTS, *INTERESTING_STRS, 1.5, True, None, [], {},
                                  ["S(0)"], {"x": ["R"]}])
    elif op == "delete":
        target = rng.choice([d, d["strategy"]])
        del target[rng.choice(list(target))]
    elif op == "unknown":
        rng.choice([d, d["strategy"]])["fuzz_field"] = 1
    text = json.dumps(d)
    if op == "text":
        a = rng.randrange(len(text))
        text = text[:a] + rng.choice(["", "}", "[", '"', "1e400", "NaN", ",,"]) + text[a + rng.randint(0, 6):]
    return Case("plan", op, text)


def _check_plan(case: Case, rng: random.Random, counts: Counter) -> str:
    from meshplan.plan import Plan, PlanError

    got = run_with_deadline(lambda: Plan.from_json(case.payload), TIMEOUT_S)
    verdict = _classify(case, got, (PlanError,))
    if verdict == "accepted" and rng.random() < 0.15:  # some accepted plans are costed too
        from meshplan.engine import Engine

        costed = run_with_deadline(lambda: Engine.from_plan(got[1]).cost(), TIMEOUT_S)
        verdict2 = _classify(Case("plan-cost", case.mutation, costed), costed, (ValueError,))
        counts[f"costed_{verdict2}"] += 1
        if verdict2 in ("timeout", "traceback"):
            return verdict2
    return verdict


# -- command lines --------------------------------------------------------------------------

def _cli_bases(out: Path) -> dict[str, list[str]]:
    pir = str(SHARED / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir")
    return {
        "cost": ["cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "8",
                 "--dp", "2", "--pp", "2", "--schedule", "1F1B"],
        "simulate": ["simulate", "--schedule", "ZBVPP", "--stages", "4", "--microbatches", "8",
                     "--tf", "1", "--tb", "1", "--tw", "0.5", "--tcomm", "0.1"],
        "tune": ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "16",
                 "--layers", "2", "--trials", "1", "--storage", "memory", "--no-progress",
                 "--output", str(out / "tune")],
        "complete": ["complete", "--program", pir, "--mesh", "d0=2", "--annotate",
                     "parameter_0=-1,0", "--summary-only"],
        "complete-model": ["complete", "--model", "llama2-7b", "--layers", "1", "--dp", "2",
                           "--summary-only"],
    }


#: (command, option) -> a value beyond the option's documented bound
CLI_UNBOUNDED = {
    ("simulate", "--stages"): lambda r: str(10 ** r.randint(6, 20)),
    ("simulate", "--microbatches"): lambda r: str(10 ** r.randint(6, 20)),
    ("simulate", "--tw"): lambda r: r.choice(["1e308", "inf", "nan", "1e12"]),
    ("simulate", "--tf"): lambda r: r.choice(["1e308", "-inf", "nan", "0"]),
    ("cost", "--global-batch"): lambda r: str(10 ** r.randint(9, 20)),
    ("cost", "--seq-len"): lambda r: str(10 ** r.randint(9, 20)),
    ("cost", "--dp"): lambda r: str(10 ** r.randint(7, 20)),
    ("tune", "--global-batch"): lambda r: str(10 ** r.randint(9, 20)),
    ("tune", "--study"): lambda r: r.choice(["../../../x", "a/b", ".hidden", "..", "/abs", "x y", "é"]),
    ("tune", "--trials"): lambda r: str(10 ** r.randint(8, 20)),
    ("complete-model", "--layers"): lambda r: str(10 ** r.randint(5, 20)),
}


def _mutate_cli(rng: random.Random, out: Path) -> Case:
    bases = _cli_bases(out)
    name = rng.choice(list(bases))
    argv = list(bases[name])
    op = rng.choice(["unbounded", "unbounded", "value", "drop", "dup", "unknown", "schedule",
                     "memory_limit", "swap"])
    if op == "unbounded":
        keys = [k for k in CLI_UNBOUNDED if k[0] == name]
        if keys:
            (_, flag) = key = rng.choice(keys)
            val = CLI_UNBOUNDED[key](rng)
            if flag in argv:
                argv[argv.index(flag) + 1] = val
            else:
                argv += [flag, val]
            return Case("cli", f"{name} {flag}", argv, f"{flag} {val} beyond its bound")
    opts = [i for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)
            and not argv[i + 1].startswith("--")]
    if op == "value" and opts:
        i = rng.choice(opts)
        argv[i + 1] = str(rng.choice([*INTERESTING_INTS, *INTERESTING_STRS, 1e308, -2.5]))
    elif op == "drop" and opts:
        i = rng.choice(opts)
        del argv[i:i + 2]
    elif op == "dup" and opts:
        i = rng.choice(opts)
        argv += argv[i:i + 2]
    elif op == "unknown":
        argv.insert(rng.randrange(1, len(argv) + 1), rng.choice(["--nope", "-x", "--", "---"]))
    elif op == "schedule":
        argv += ["--schedule", rng.choice(["zbv", "ZB-2p", "VPP", "zb", "nope", "1f1b-i", "GPipe"])]
        if name in ("cost", "complete-model") and rng.random() < 0.5:
            argv += ["--vpp", str(rng.choice([1, 2, 3, 64, 65]))]
        if name == "simulate" and rng.random() < 0.5:
            argv += ["--chunks", str(rng.choice([1, 2, 3, 64, 65]))]
    elif op == "memory_limit":
        argv = list(bases["simulate"])
        argv[argv.index("--schedule") + 1] = "ZB"
        val = rng.choice(["1", "2.5", "8", "1e308", "nan", "inf", "0", "-3", "1e7"])
        argv += ["--memory-limit", val]
        bad = not (1 <= float(val) <= 2**20)
        return Case("cli", "simulate --memory-limit", argv,
                    f"--memory-limit {val} outside 1..2**20" if bad else "")
    elif op == "swap" and len(opts) > 1:
        i, j = rng.sample(opts, 2)
        argv[i + 1], argv[j + 1] = argv[j + 1], argv[i + 1]
    return Case("cli", f"{name} {op}", argv)


def _check_cli(case: Case) -> str:
    from meshplan.cli import main

    out, err = io.StringIO(), io.StringIO()

    def go():
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(case.payload))

    status, val = run_with_deadline(go, TIMEOUT_S)
    text = out.getvalue() + err.getvalue()
    if status == "timeout":
        return _record_failure(case, "timeout", "")
    if status == "raised" or "Traceback" in text:
        return _record_failure(case, "traceback", f"{val!r}\n{text[-3000:]}")
    if val not in (0, 1, 2):
        return _record_failure(case, "traceback", f"exit code {val!r}\n{text[-3000:]}")
    # exit 1 after "no feasible plan found" / "no size qualifies": the search's own answer
    answered = val == 1 and any(m in out.getvalue() for m in ("no feasible plan found", "no size qualifies"))
    if val == 0 or answered:
        if case.must_refuse:
            return _record_failure(case, "silently_accepted", text[-2000:])
        return "accepted"
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if not (last.startswith("error: ") or last.startswith("Error: ")):
        return _record_failure(case, "traceback", f"no error line: {err.getvalue()[-2000:]!r}")
    if last.startswith("error: ") and sum(ln.startswith("error: ") for ln in lines) != 1:
        return _record_failure(case, "traceback", f"more than one error line: {lines!r}")
    return "refused"


# -- verdicts -------------------------------------------------------------------------------

FAILURES: list[tuple[str, str, object, str]] = []


def _record_failure(case: Case, what: str, detail: str) -> str:
    FAILURES.append((what, f"{case.kind}/{case.mutation}", case.payload if isinstance(case.payload, list)
                     else str(case.payload)[:500], str(detail)[:3000]))
    return what


def _classify(case: Case, got: tuple[str, object], errors: tuple[type, ...]) -> str:
    status, val = got
    if status == "timeout":
        return _record_failure(case, "timeout", "")
    if status == "ok":
        if case.must_refuse:
            return _record_failure(case, "silently_accepted", case.must_refuse)
        return "accepted"
    if isinstance(val, errors):
        msg = str(val)
        if "\n" in msg.strip():
            return _record_failure(case, "traceback", f"multi-line message: {msg[:1000]!r}")
        return "refused"
    import traceback

    return _record_failure(case, "traceback", "".join(traceback.format_exception(val))[-3000:])


# -- the run --------------------------------------------------------------------------------

def _cases(rng: random.Random, n: int, out: Path) -> Iterator[Case]:
    pir = [p.read_text() for p in PROGRAMS]
    ymls = [yaml.safe_load(p.read_text()) for p in CLUSTERS]
    plans = [json.loads(p.read_text()) for p in PLANS]
    plans = [p for p in plans if "strategy" in p]  # benchmarks/plans also holds model configs
    for p in plans:  # the run's cwd is a scratch directory: model paths made absolute
        if not Path(p["model"]).is_absolute() and (ROOT / p["model"]).exists():
            p["model"] = str(ROOT / p["model"])
    kinds = list(WEIGHTS)
    counts = {k: max(1, math.floor(n * w)) for k, w in WEIGHTS.items()}
    counts["pir"] += n - sum(counts.values())
    order = [k for k in kinds for _ in range(counts[k])]
    rng.shuffle(order)
    for kind in order:
        if kind == "pir":
            yield _mutate_pir(rng, rng.choice(pir))
        elif kind == "yaml":
            yield _mutate_yaml(rng, rng.choice(ymls))
        elif kind == "plan":
            yield _mutate_plan(rng, rng.choice(plans))
        else:
            yield _mutate_cli(rng, out)


def test_fuzz_inputs(tmp_path, monkeypatch):
    """Every fuzz input ends accepted or refused with a one-line error of the package's
    type, within its deadline; no invalid-by-construction input is accepted."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    work = tmp_path / "cwd"  # whatever a mutated command line writes lands here
    work.mkdir()
    monkeypatch.chdir(work)
    FAILURES.clear()
    rng = random.Random(SEED)
    stats: dict[str, Counter] = {}
    t0 = time.monotonic()
    trace = open(TRACE, "a") if TRACE else None  # noqa: SIM115 - closed below
    for i, case in enumerate(_cases(rng, N_INPUTS, tmp_path)):
        if trace is not None:
            trace.write(f"{i} {case.kind} {case.mutation} {str(case.payload)[:300]!r}\n")
            trace.flush()
        if case.kind == "pir":
            verdict = _check_pir(case)
        elif case.kind == "yaml":
            verdict = _check_yaml(case, tmp_path)
        elif case.kind == "plan":
            verdict = _check_plan(case, rng, stats.setdefault("plan", Counter()))
        else:
            verdict = _check_cli(case)
        c = stats.setdefault(case.kind, Counter())
        c["inputs"] += 1
        c[verdict] += 1
        if case.must_refuse:
            c["invalid_by_construction"] += 1
    if trace is not None:
        trace.close()
    summary = {k: dict(v) for k, v in stats.items()}
    summary["_total"] = dict(sum(stats.values(), Counter()))
    summary["_seconds"] = round(time.monotonic() - t0, 1)
    summary["_seed"], summary["_timeout_s"] = SEED, TIMEOUT_S
    if REPORT:
        Path(REPORT).write_text(json.dumps({"counts": summary, "failures": FAILURES[:50]}, indent=2,
                                           default=str))
    print(json.dumps(summary, indent=1))
    assert not FAILURES, "\n\n".join(f"{w} {k}: {p!r}\n{d}" for w, k, p, d in FAILURES[:10])


@pytest.mark.parametrize("fn, expect", [(lambda: time.sleep(5), "timeout"), (lambda: 1 / 0, "raised"),
                                        (lambda: 3, "ok")])
def test_the_deadline_stops_a_hanging_input(fn, expect):
    t0 = time.monotonic()
    assert run_with_deadline(fn, 0.2)[0] == expect
    assert time.monotonic() - t0 < 2
