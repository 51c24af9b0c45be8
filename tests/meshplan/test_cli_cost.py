"""``meshplan cost``: JSON keys and values agree with Engine.simulate(), text output, trace,
and one-line errors."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main
from meshplan.engine import Engine
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main

ARGS = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--dp", "2", "--pp", "2", "--micro-batch-size", "1", "--global-batch", "8",
        "--recompute", "full", "--zero", "1"]


def test_json_output_matches_the_engine(capsys):
    assert main([*ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("step_time_ms", "tokens_per_s", "tflops_per_gpu", "mfu", "max_memory_bytes",
                "time_breakdown_s", "memory_breakdown_bytes"):
        assert key in out
    strat = Strategy(dp=2, pp=2, micro_batch_size=1, global_batch_size=8, recompute="full",
                     zero=1)
    t_ms, peak = Engine("megatron-1.7b", "dgx-a100-80g", strat, nodes=1).cost()
    assert out["step_time_ms"] == pytest.approx(t_ms)
    assert out["max_memory_bytes"] == peak
    assert out["tokens_per_s"] == pytest.approx(8 * 2048 / (t_ms / 1e3))
    # executed FLOPs include the recompute forward; MFU counts model FLOPs only
    assert out["executed_flops_per_step"] > out["model_flops_per_step"]
    assert set(out["time_breakdown_s"]) == {"compute", "tp_comm", "overlapped", "pp_comm", "bubble",
                                            "dp_sync", "optimizer"}


def test_text_output_and_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main([*ARGS, "--trace", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "time breakdown" in text and "memory breakdown" in text and "MFU" in text
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e["ph"] == "X" and e["tid"] == 0]  # the compute threads (issue 20: a thread per stream)
    # 2 stages x m = 4 micro-batches x (F, BW) actions
    assert len(events) == 2 * 4 * 2


@pytest.mark.parametrize("extra,needle", [
    (["--dp", "3"], "--global-batch"),  # the flag, not the field (issue 20 item 9)
    (["--recompute", "most"], "recompute"),
    (["--zero", "5"], "--zero (ZeRO stage)"),
    (["--cp-comm", "all_gather"], "--cp-comm all_gather needs --cp > 1"),  # was silently ignored
    (["--vpp", "2", "--pp", "1", "--dp", "4"], "--vpp = 2 needs --pp > 1"),
])
def test_bad_input_is_a_one_line_error(capsys, extra, needle):
    from tests._cli import with_flags

    assert main(with_flags(ARGS, *extra)) == 2  # in place: a repeated option is refused
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1


def test_out_of_memory_is_reported(capsys):
    """llama2-7b unsharded on one A100 80GB: bf16 weights + grads + fp32 Adam states alone
    are 16 bytes x 6.74e9 = 108 GB > 80 GB, so the plan cannot fit; the report says so."""
    args = ["cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "8",
            "--seq-len", "512"]
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # issue 15: the capacity is the 80 GiB of HBM, usable = capacity - the driver's 871 MiB,
    # the default 5% headroom of usable memory stays free
    usable = 80 * 2**30 - 871 * 2**20
    assert d["device_memory_bytes"] == 80 * 2**30 and d["usable_memory_bytes"] == usable
    assert d["memory_headroom"] == 0.05 and d["memory_limit_bytes"] == int(usable * 0.95)
    assert d["max_memory_bytes"] >= 16 * 6.738e9 and d["fits_in_memory"] is False
    assert main(args) == 0
    assert "OUT OF MEMORY" in capsys.readouterr().out
    # ZeRO-3 over 8 ranks: 16 x 6.74e9 / 8 = 13.5 GB of model states, it fits
    assert main(args + ["--dp", "8", "--zero", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits_in_memory"] is True


def test_json_warnings_carry_the_models_warnings(capsys):
    """Found by a new-user check: Gemma-2's two soft-capping keys (known, not modelled)
    warned on stderr but --json's ``warnings`` list was empty; now the list holds them (and
    stderr still shows each once)."""
    from pathlib import Path

    from meshplan.cli import main

    cfg = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "gemma-2-9b.json"
    args = ["cost", "--model", str(cfg), "--cluster", "dgx-h100", "--dp", "8", "--global-batch", "64",
            "--seq-len", "4096", "--json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)["warnings"]
    soft = [w for w in got if "softcapping" in w]
    assert len(soft) == 2 and any("attn_logit_softcapping=50.0" in w for w in soft)
    assert sum("softcapping" in ln for ln in err.splitlines()) == 2


def test_a_model_that_warns_with_a_refused_strategy_errors_at_once():
    """Found by a review: the warnings were replayed inside catch_warnings(record=True),
    which recorded each again, so the replay never ended (a hang) for a config that warns
    (Llama-3.1's context window) and a strategy cost refuses. Both the warning and the one
    error line now come out (a process of its own: pytest records warnings in-process)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cfg = root / "tests" / "data" / "hf_configs" / "llama-3.1-8b.json"
    for extra in ([], ["--json"]):
        p = subprocess.run([sys.executable, "-m", "meshplan.cli", "cost", "--model", str(cfg), "--cluster",
                            "dgx-h100", "--tp", "3", "--global-batch", "8", *extra],
                           cwd=root, capture_output=True, text=True, timeout=60)
        err = p.stderr.splitlines()
        assert p.returncode == 2 and err[-1].startswith("error: --tp = 3 does not divide"), p.stderr
        assert [ln for ln in err[:-1] if ln.startswith("warning: ") and "context window" in ln], p.stderr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mfu_is_against_the_bf16_peak_whatever_the_dtype(capsys, dtype):
    """MFU = model FLOPs / (step x GPUs x the device's BF16 peak, 312 TFLOP/s on an A100),
    as the README defines it: an fp32 plan used to be divided by the 19.5 TFLOP/s fp32
    peak (MFU 63% for 42 TFLOP/s per GPU on an H100)."""
    assert main([*ARGS, "--dtype", dtype, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    step_s, gpus = out["step_time_ms"] / 1e3, 2 * 2
    assert out["mfu"] == pytest.approx(out["model_flops_per_step"] / (step_s * gpus * 312e12), rel=1e-9)
    assert 0 < out["mfu"] < 1


def test_cost_re_costs_a_plan_file_on_its_cluster_or_another(tmp_path, capsys):
    """A new-user pass: `cost runs/x/plan.json` said 'Missing option --model' (export and
    validate take PLAN.json; re-costing a tuned plan on another cluster took the Python
    API). cost takes it: the figures are Engine.from_plan's; --cluster moves it; a strategy
    option beside it is refused naming both."""
    from meshplan import Engine, Plan, Strategy
    from tests._cli import run_main

    s = Strategy(dp=2, tp=4, micro_batch_size=8, global_batch_size=32, zero=1)
    path = tmp_path / "plan.json"
    Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, nodes=1, num_layers=4).save(path)
    for cluster in (None, "dgx-h100"):
        extra = () if cluster is None else ("--cluster", cluster)
        rc, out, err = run_main(capsys, "cost", str(path), *extra, "--json")
        assert rc == 0, err
        got = json.loads(out)
        res = Engine.from_plan(path, cluster).simulate()
        assert got["step_time_ms"] == pytest.approx(res.step_time * 1e3, rel=1e-12)
        assert got["max_memory_bytes"] == res.max_memory_bytes
    rc, out, err = run_main(capsys, "cost", str(path), "--tp", "2")
    assert rc == 2 and "give PLAN.json or the model and strategy options, not both" in err and "--tp" in err
    rc, out, err = run_main(capsys, "cost", "--cluster", "dgx-h100")
    assert rc == 2 and "cost: give --model, --global-batch with the strategy options, or a PLAN.json" in err
    # the plan's sequence and attention are the plan file's, not flags (a review)
    Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s.replace(attention="unfused"), nodes=1,
         num_layers=4, seq_len=2048).save(path)
    rc, out, err = run_main(capsys, "cost", str(path))
    assert rc == 0, err
    assert "seq len 2048 (from the plan file)" in out and "attention unfused (from the plan file)" in out
    rc, out, err = run_main(capsys, "cost", str(path), "--cluster", "cpu-local")
    assert rc == 2 and "give more nodes (--nodes) or smaller degrees" in err and "--dp*" not in err


def test_a_plan_file_is_never_overwritten_and_a_tune_folder_is_read(tmp_path, capsys):
    """A hunt: `cost x.json --trace x.json` and `export y.json -o y.json` replaced the plan
    they read. Both are refused; tune's --output folder reads as its plan.json."""
    from meshplan import Plan, Strategy
    from tests._cli import run_main

    path = tmp_path / "plan.json"
    Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=Strategy(dp=8, global_batch_size=8),
         nodes=1, num_layers=2).save(path)
    before = path.read_text()
    rc, _, err = run_main(capsys, "cost", str(path), "--trace", str(path))
    assert rc == 2 and "PLAN.json and --trace name the same file" in err
    rc, _, err = run_main(capsys, "export", str(path), "--to", "deepspeed", "-o", str(path))
    assert rc == 2 and "PLAN.json and --output name the same file" in err
    assert path.read_text() == before
    rc, out, err = run_main(capsys, "cost", str(tmp_path), "--json")
    rc2, out2, _ = run_main(capsys, "cost", str(path), "--json")
    assert rc == rc2 == 0 and json.loads(out)["step_time_ms"] == json.loads(out2)["step_time_ms"]


def test_outputs_never_overwrite_an_input(capsys, tmp_path):
    """A hunt: --trace over the --model config.json or the --cluster YAML, and export -o over
    the config, replaced the input in silence (only PLAN.json was guarded)."""
    import shutil

    from clusters import CATALOG_DIR

    cfg = tmp_path / "tiny.json"
    cfg.write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                   '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256, '
                   '"max_position_embeddings": 64}')
    yml = tmp_path / "h.yaml"
    shutil.copy(CATALOG_DIR / "dgx-h100.yaml", yml)
    before = cfg.read_text(), yml.read_text()
    base = ("--dp", "2", "--global-batch", "4", "--seq-len", "32")
    for args, words in ((("cost", "--model", str(cfg), "--cluster", "dgx-h100", *base, "--trace", str(cfg)),
                         "--model and --trace name the same file"),
                        (("cost", "--model", "llama2-7b", "--cluster", str(yml), *base, "--trace", str(yml)),
                         "--cluster and --trace name the same file"),
                        (("export", "--to", "megatron", "--model", str(cfg), "--cluster", "dgx-h100", *base,
                          "-o", str(cfg)), "--model and --output name the same file")):
        line = one_line_error(*run_main(capsys, *args))
        assert words in line
    assert (cfg.read_text(), yml.read_text()) == before


def test_a_cpu_rate_is_printed_in_gflops(capsys):
    """A hunt: 0.0 TFLOP/s per GPU beside MFU 42% on a CPU cluster."""
    from meshplan.cost_report import flop_rate

    assert flop_rate(412.94e12) == "412.9 TFLOP/s" and flop_rate(28.31e9) == "28.3 GFLOP/s"
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--layers", "1", "--cluster", "cpu-local",
                            "--dp", "2", "--global-batch", "2", "--seq-len", "64", "--dtype", "float32",
                            "--framework", "eager")
    assert rc == 0, err
    assert " GFLOP/s per GPU" in out.splitlines()[0]
