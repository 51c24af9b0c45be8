"""Megatron-LM's argument names on ``cost``, ``tune`` and ``export`` (issue 20 item 2): each
Megatron spelling gives the same Strategy (and the same costed step) as the short one;
``--num-layers-per-virtual-pipeline-stage N`` is vpp = layers / (pp x N) as Megatron-LM's
``validate_args`` derives it, the recompute arguments map as ``TransformerConfig`` defines
them, ``--use-distributed-optimizer`` is ZeRO 1; what cannot be expressed is a one-line error
naming the flags typed."""

from __future__ import annotations

import csv
import importlib
import json
import shlex
from pathlib import Path

import pytest

from tests._cli import Stopped, one_line_error, run_main

#: megatron-1.7b: 24 layers, so pp 2 has 12 layers per stage
BASE = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--dp", "2"]
ROOT = Path(__file__).resolve().parents[2]


def _strategy(capsys, strategies, *args):
    rc, _, err = run_main(capsys, *BASE, *args)
    assert rc == 2 and "stopped before simulating" in err, err
    return strategies[-1]


MEGATRON = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "6", "--micro-batch-size", "2",
            "--global-batch-size", "16", "--recompute-granularity", "full",
            "--recompute-method", "uniform", "--recompute-num-layers", "1",
            "--use-distributed-optimizer", "--context-parallel-size", "1"]
SHORT = ["--tp", "2", "--pp", "2", "--vpp", "2", "--schedule", "VPP", "--micro-batch-size", "2",
         "--global-batch", "16", "--recompute", "full", "--zero", "1", "--cp", "1"]


def test_megatron_spelling_gives_the_short_spellings_strategy(capsys, strategies):
    m = _strategy(capsys, strategies, *MEGATRON)
    s = _strategy(capsys, strategies, *SHORT)
    assert m == s
    assert (s.tp, s.pp, s.vpp, s.schedule, s.recompute, s.zero) == (2, 2, 2, "VPP", "full", 1)


@pytest.mark.parametrize("n,vpp,schedule", [
    (12, 1, "1F1B"),  # one chunk of the stage's 12 layers: plain 1F1B, as Megatron runs it
    (6, 2, "VPP"), (4, 3, "VPP"), (3, 4, "VPP"), (1, 12, "VPP"),
])
def test_layers_per_virtual_stage_is_vpp(capsys, strategies, n, vpp, schedule):
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16",
                  "--num-layers-per-virtual-pipeline-stage", str(n))
    assert (s.vpp, s.schedule) == (vpp, schedule)  # 24 layers / (2 x n)


def test_a_given_schedule_is_kept_and_virtual_stages_is_vpp(capsys, strategies):
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", "--schedule", "zbv",
                  "--num-layers-per-virtual-pipeline-stage", "6")
    assert (s.vpp, s.schedule) == (2, "ZBVPP")
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16",
                  "--num-virtual-stages-per-pipeline-rank", "3")
    assert (s.vpp, s.schedule) == (3, "VPP")
    # --vpp is the same option (one entry in --help): it switches the default 1F1B too
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", "--vpp", "3")
    assert (s.vpp, s.schedule) == (3, "VPP")
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", "--vpp", "2",
                  "--schedule", "ZBVPP")
    assert (s.vpp, s.schedule) == (2, "ZBVPP")


@pytest.mark.parametrize("args,recompute", [
    (["--recompute-granularity", "selective"], "selective"),
    (["--recompute-activations"], "selective"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform"], "full"),
    (["--recompute-granularity", "FULL", "--recompute-method", "block",
      "--recompute-num-layers", "12"], "full"),  # every layer of the 12-layer chunk
    (["--num-layers-per-virtual-pipeline-stage", "6", "--recompute-granularity", "full",
      "--recompute-method", "block", "--recompute-num-layers", "6"], "full"),
])
def test_recompute_arguments(capsys, strategies, args, recompute):
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", *args)
    assert s.recompute == recompute


@pytest.mark.parametrize("args,message", [
    (["--num-layers-per-virtual-pipeline-stage", "5"],
     "error: --num-layers-per-virtual-pipeline-stage 5 does not divide the 12 layers of each "
     "pipeline stage (24 layers / --pp 2)"),  # --pp as typed
    (["--vpp", "2", "--num-layers-per-virtual-pipeline-stage", "6"],
     "error: --vpp and --num-layers-per-virtual-pipeline-stage: both set the virtual pipeline "
     "size; give one of them"),
    (["--recompute-granularity", "full"],
     "error: --recompute-granularity full needs --recompute-method uniform or block"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "2"],
     "error: --recompute-num-layers 2 with --recompute-method uniform (recompute units of "
     "several layers) is not modelled"),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "4"],
     "error: --recompute-method block with --recompute-num-layers 4 recomputes only part of "
     "each model chunk's 12 layers"),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"],
     "error: --recompute-method is not taken with --recompute-granularity selective"),
    (["--recompute-method", "uniform"],
     "error: --recompute-method needs --recompute-granularity full"),
    (["--recompute", "none", "--recompute-granularity", "selective"],
     "error: --recompute and --recompute-granularity: they ask for none and selective recompute"),
    (["--zero-stage", "2", "--use-distributed-optimizer"],
     "error: --zero-stage and --use-distributed-optimizer: the distributed optimizer is ZeRO "
     "stage 1, not 2; give one of them"),
    (["--recompute-granularity", "partial"], "'--recompute-granularity'"),
])
def test_what_megatron_cannot_mean_here_is_one_line(capsys, args, message):
    line = one_line_error(*run_main(capsys, *BASE, "--pp", "2", "--global-batch", "16", *args))
    assert line.startswith(message) or message in line, line


def test_megatron_spelling_costs_the_same(capsys):
    out = []
    for spelling in (MEGATRON, SHORT):
        rc, text, err = run_main(capsys, *BASE, *spelling, "--json")
        assert rc == 0, err
        out.append(json.loads(text))
    # the Megatron spelling also says Megatron-LM splits evenly where the cost model balanced
    notes = out[0].pop("warnings"), out[1].pop("warnings")
    assert out[0] == out[1]
    extra = [w for w in notes[0] if w not in notes[1]]
    assert len(extra) == 1 and extra[0].startswith("with Megatron-LM arguments: the cost model balanced "
                                                   "the pipeline stages as [6, 7, 6, 5]")
    assert out[0]["layout"] == {"dp": 2, "tp": 2, "pp": 2, "cp": 1, "ep": 1, "vpp": 2, "schedule": "VPP",
                                "micro_batch_size": 2, "global_batch_size": 16,
                                "recompute": "full", "zero": 1, "sequence_parallel": False}
    rc, text, _ = run_main(capsys, *BASE, *MEGATRON)
    assert rc == 0
    assert ("plan: dp=2 tp=2 pp=2 cp=1 vpp=2 VPP, mbs 2, gbs 16, recompute full, zero 1, sp off"
            in text.splitlines())


# --- tune: the options pin their knob, as --fix does -------------------------------------

TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "16", "--seq-length", "512", "--num-layers", "4",
        "--storage", "memory", "--no-progress"]


@pytest.fixture
def searches(monkeypatch):
    search_module = importlib.import_module("tuner.search")
    seen = []

    def search(cfg, name, **kw):
        seen.append((cfg.to_dict(), name))
        raise Stopped("stopped before searching")

    monkeypatch.setattr(search_module, "search", search)
    return seen


@pytest.mark.parametrize("pins", [
    ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
     "--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer",
     "--recompute-granularity", "selective", "--micro-batch-size", "1"],
    ["--tp", "2", "--pp", "2", "--vpp", "2", "--schedule", "vpp", "--zero", "1",
     "--recompute", "selective", "--micro-batch-size", "1"],
])
def test_tune_pins_are_the_fix(capsys, searches, tmp_path, pins):
    fix = ["--fix", "tp=2,pp=2,vpp=2,schedule=VPP,zero=1,recompute=selective,mbs=1"]
    for args in (pins, fix):
        rc, _, err = run_main(capsys, *TUNE, "--output", str(tmp_path), *args)
        assert rc == 2 and "stopped before searching" in err, err
    (pinned, name), (fixed, fix_name) = searches
    assert pinned == fixed and name == fix_name
    assert pinned["space"]["fix"] == {"tp": 2, "pp": 2, "vpp": 2, "schedule": "VPP", "zero": 1,
                                      "recompute": "selective", "micro_batch_size": 1}


@pytest.mark.parametrize("args,message", [
    (["--tp", "3"], "error: --tp 3 does not divide the world size 8"),
    (["--tensor-model-parallel-size", "3"],
     "error: --tensor-model-parallel-size 3 does not divide the world size 8"),
    (["--fix", "tp=2", "--tp", "4"], "error: --tp pins tp=4 but --fix pins tp=2; give one of them"),
    (["--num-layers-per-virtual-pipeline-stage", "1"],
     "error: --num-layers-per-virtual-pipeline-stage needs the layers per pipeline stage: pin "
     "--pp/--pipeline-model-parallel-size too"),
    (["--pp", "2", "--num-layers-per-virtual-pipeline-stage", "3"],
     "error: --num-layers-per-virtual-pipeline-stage 3 does not divide the 2 layers"),
    (["--fix", "tp=3"], "error: --fix: tp=3 does not divide the world size 8"),
])
def test_tune_pin_errors_name_the_flag(capsys, tmp_path, args, message):
    line = one_line_error(*run_main(capsys, *TUNE, "--output", str(tmp_path), *args))
    assert line.startswith(message), line


def test_tune_with_megatron_names_searches_inside_the_pins(capsys, tmp_path):
    rc, out, err = run_main(capsys, *TUNE, "--output", str(tmp_path), "--sampler", "random",
                            "--trials", "3", "--tensor-model-parallel-size", "2",
                            "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
                            "--recompute-granularity", "selective")
    assert rc == 0, err
    rows = [r for r in csv.DictReader((tmp_path / "history.csv").open()) if r["dp"]]
    assert rows  # (a pruned trial has no candidate columns)
    assert all(r["tp"] == "2" and r["pp"] == "1" and r["zero"] == "1"
               for r in rows), rows
    s = json.loads((tmp_path / "plan.json").read_text())["strategy"]  # 4 small layers fit
    assert (s["tp"], s["pp"], s["zero"], s["recompute"]) == (2, 1, 1, "selective")
    assert f"dp=4 tp=2 pp=1 cp=1 vpp={s['vpp']}" in out
    report = (tmp_path / "report.txt").read_text()  # 200 columns (the terminal's may wrap)
    assert "dp-tp-pp-cp" in report and "4-2-1-1" in report  # the top-plans table's mesh column


# --- export: a plan given by the strategy options ------------------------------------------

EXPORT = ["export", "--to", "megatron", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g",
          "--nodes", "1", "--dp", "2"]


def test_export_takes_megatron_names_and_round_trips(capsys):
    rc, m_out, err = run_main(capsys, *EXPORT, *MEGATRON)
    assert rc == 0, err
    rc, s_out, err = run_main(capsys, *EXPORT, *SHORT)
    assert rc == 0, err
    assert m_out == s_out
    args = [a for ln in m_out.splitlines() if not ln.startswith("#")
            for a in shlex.split(ln.rstrip(" \\"))]
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "6"
    # Megatron's own output fed back whole (--bf16 and --optimizer adam included): the same
    # arguments; cost takes it too (a new-user pass: "No such option: --bf16")
    assert "--bf16" in args and args[args.index("--optimizer") + 1] == "adam"
    rc, again, err = run_main(capsys, "export", "--to", "megatron", "--model", "megatron-1.7b",
                              "--cluster", "dgx-a100-80g", "--nodes", "1", "--dp", "2", *args)
    assert rc == 0, err
    assert again == m_out
    rc, out, err = run_main(capsys, *BASE, *args, "--json")
    rc2, out2, err2 = run_main(capsys, *BASE, *SHORT, "--json")
    assert rc == rc2 == 0, err + err2
    assert json.loads(out)["step_time_ms"] == json.loads(out2)["step_time_ms"]


@pytest.mark.parametrize("args,dtype,optimizer", [
    (["--bf16"], "bfloat16", "adamw"),
    (["--fp16"], "float16", "adamw"),
    (["--bf16", "--fp8-format", "hybrid"], "bfloat16", "adamw"),  # Megatron's default: delayed
    (["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"], "bfloat16", "adamw"),
    (["--bf16", "--optimizer", "sgd"], "bfloat16", "sgd"),
    (["--optimizer", "adam", "--dtype", "float32"], "float32", "adamw"),
])
def test_megatron_precision_and_optimizer_flags(capsys, strategies, args, dtype, optimizer):
    """--bf16 / --fp16 / --fp8-format [--fp8-recipe] are --dtype's values; --optimizer adam is
    AdamW (Megatron's decoupled weight decay), sgd is sgd."""
    s = _strategy(capsys, strategies, "--global-batch", "16", *args)
    assert (s.dtype, s.optimizer) == (dtype, optimizer)
    # Megatron's tensorwise is Transformer Engine's current scaling, costed as delayed
    assert s.fp8 == (None if "--fp8-format" not in args else "te-delayed")


@pytest.mark.parametrize("args,message", [
    (["--bf16", "--fp16"], "error: --bf16 and --fp16 both given"),
    (["--fp8-recipe", "delayed"], "error: --fp8-recipe needs --fp8-format"),
    (["--fp16", "--fp8-format", "hybrid"], "error: --fp8-format with --fp16"),
    (["--dtype", "float16", "--bf16"], "error: --dtype and --bf16: they ask for float16 and bfloat16"),
    (["--fp8-format", "hybrid", "--fp8-amax-compute-algo", "mean"],
     "error: --fp8-amax-compute-algo 'mean': Megatron-LM takes max or most_recent"),
])
def test_megatron_precision_conflicts_are_one_line(capsys, args, message):
    line = one_line_error(*run_main(capsys, *BASE, "--global-batch", "16", *args))
    assert line.startswith(message), line


def test_export_plan_file_or_options(capsys, tmp_path):
    line = one_line_error(*run_main(capsys, "export", "plan.json", "--to", "megatron",
                                    "--tensor-model-parallel-size", "2"))
    assert line == ("error: export: give PLAN.json or the strategy options, not both "
                    "(got plan.json and --tensor-model-parallel-size; --cluster and --nodes move "
                    "the plan to another cluster)")
    line = one_line_error(*run_main(capsys, "export", "--to", "torchtitan", "--tp", "2",
                                    "--global-batch-size", "8"))
    assert line == "error: export: give PLAN.json, or --model and --cluster with the strategy options"
    line = one_line_error(*run_main(capsys, *EXPORT, "--tp", "2"))
    assert line.startswith("error: export: give PLAN.json, or --global-batch-size")


# --- the tours' commands in Megatron's names run -------------------------------------------

def _readme_commands(prefix: str) -> list[list[str]]:
    """The ``meshplan PREFIX ...`` commands that use a Megatron-LM name, as argv: those of
    the README's five-minute tour, the docs' command tour (docs/tutorials/tour.md) and the
    Megatron names page (their home since issue 40)."""
    text = "\n".join((ROOT / f).read_text() for f in ("README.md", "docs/tutorials/tour.md",
                                                         "docs/reference/megatron-names.md"))
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(f"meshplan {prefix} ") and any(
                m in line for m in ("-model-parallel-size", "--global-batch-size",
                                    "--use-distributed-optimizer")):
            out.append(shlex.split(line)[1:])
    return out


def test_readme_cost_commands_in_megatron_names(capsys):
    cmds = _readme_commands("cost")
    assert len(cmds) >= 2
    for argv in cmds:
        rc, out, err = run_main(capsys, *argv)
        assert rc == 0, (argv, err)
        if "--json" in argv:  # the 70b one: 80 layers / (pp 4 x 10) = vpp 2, interleaved
            lay = json.loads(out)["layout"]
            assert (lay["vpp"], lay["schedule"], lay["recompute"], lay["zero"]) == (2, "VPP", "full", 1)


def test_readme_tune_command_in_megatron_names(capsys, tmp_path):
    cmds = _readme_commands("tune")
    assert cmds
    for argv in cmds:  # as written, with a small budget and a scratch output (in place: a
        # repeated option is refused)
        small = {"--trials": "8", "--output": str(tmp_path)}
        argv = [small.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
        argv += [x for f, v in small.items() if f not in argv for x in (f, v)]
        rc, out, err = run_main(capsys, *argv, "--storage", "memory", "--no-progress")
        # exit 1 is the search's own answer "no feasible plan found" in this small budget
        assert rc == 0 or (rc == 1 and "no feasible plan found" in out), (argv, err)
        rows = [r for r in csv.DictReader((tmp_path / "history.csv").open()) if r["dp"]]
        # --use-distributed-optimizer pins ZeRO 1 wherever it means something (dp > 1; the
        # sampler takes no ZeRO stage for dp = 1, tuner.suggest)
        assert rows and all(r["zero"] == ("1" if int(r["dp"]) > 1 else "0")
                            for r in rows)


def test_readme_export_command_in_megatron_names(capsys):
    cmds = _readme_commands("export")
    assert cmds
    for argv in cmds:
        rc, out, err = run_main(capsys, *argv)
        assert rc == 0, (argv, err)
        # 32 layers / (pp 2 x 8) = 2 chunks, interleaved; ZeRO 1 has no FSDP2 form (a note)
        assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in out
        assert "tensor_parallel_degree = 4" in out and "note: zero:" in err


def test_megatron_chunks_with_a_one_chunk_schedule_name_the_megatron_flag(capsys):
    """``--schedule 1F1B --num-layers-per-virtual-pipeline-stage 8`` named ``--vpp``, a flag
    not typed; now the message names the Megatron flag and the way out."""
    line = one_line_error(*run_main(capsys, *BASE, "--global-batch", "16", "--pp", "2",
                                    "--schedule", "1F1B",
                                    "--num-layers-per-virtual-pipeline-stage", "4"))
    assert line.startswith("error: --num-layers-per-virtual-pipeline-stage gives") and "--vpp " not in line
