"""The calibration loop of a real CPU executor trace, through the CLI (issue 19): a shrunk
LLaMA (2 layers, hidden 128) on 2 gloo ranks runs under ``meshplan validate
--profile-trace`` (each rank records extra, untimed profiled steps with ``record_shapes``),
``meshplan calibrate --from-trace`` fits the plan's cluster to them, and ``meshplan
validate --cluster`` predicts with the fitted YAML (the README's three commands). Asserted:
the traces hold what the fit needs, the fit is written with its provenance and the
optimizer op's rate, and the second validate predicts exactly what calibrate printed.

Not asserted, because it does not hold on this host (issue 19, open): the re-predicted
step within 10% of the measured one. On 2 ranks on 2 cores the profiled steps run 1.4x to
2.3x as long as the timed ones, while the per-event probe explains a few percent, so the
fit keeps the rest; the test prints the figures (``-s``) instead of passing on them."""

from __future__ import annotations

import json
import re

import pytest

from tests._cli import run_main

MODEL = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 352, "vocab_size": 1000,
         "max_position_embeddings": 64}
STEP = re.compile(r"step \(ms\): measured ([\d.]+) .*predicted before ([\d.]+) \(.*\), after ([\d.]+)")
#: the target of issue 19: the re-predicted step within 10% of the measured one
BAND = 0.10


def _plan(tmp_path) -> str:
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy

    cfg = tmp_path / "llama-tiny.json"
    cfg.write_text(json.dumps(MODEL))
    s = Strategy(dp=2, dtype="float32", optimizer="sgd", micro_batch_size=2, global_batch_size=8)
    return str(Plan(str(cfg), "cpu-local", s, seq_len=64).save(tmp_path / "plan.json"))


@pytest.mark.slow
@pytest.mark.distributed
def test_calibration_loop_from_an_executor_trace(tmp_path, capsys):
    plan, traces, cal = _plan(tmp_path), tmp_path / "traces", tmp_path / "fitted.yaml"
    csv = str(tmp_path / "v.csv")
    rc, out, err = run_main(capsys, "validate", plan, "--steps", "5", "--repeats", "3", "--no-verify",
                            "--json", "--csv", csv, "--profile-trace", str(traces))
    assert rc == 0, err
    got = json.loads(out)
    measured = got["measured_step_time_ms"]
    for r in (0, 1):  # one trace per rank, of one step beyond the 5 timed ones, with shapes
        doc = json.loads((traces / f"rank{r}.json").read_text())
        assert doc["meshplan"]["rank"] == r and len(doc["meshplan"]["step_times_s"]) == 5
        assert len(doc["meshplan"]["profiled_steps_s"]) == 3 and doc["meshplan"]["after_step_s"] > 0
        mm = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"]
        assert mm and all(e["args"]["Input Dims"] for e in mm)
        assert any(e.get("name") == "meshplan::O bucket0 all_reduce" for e in doc["traceEvents"])
    assert got["profile_trace"] == str(traces)

    rc, out, err = run_main(capsys, "calibrate", "--from-trace", str(traces), "--plan", plan,
                            "-o", str(cal))
    assert rc == 0, err
    assert "kernel class" in out and "gemm" in out and "collective" in out
    m = STEP.search(out)
    assert m, out
    slow = next((ln for ln in out.splitlines() if ln.startswith("profiled steps:")), "")
    assert slow, out
    traced, before, after = (float(x) for x in m.groups())
    from clusters import load_cluster

    spec = load_cluster(str(cal)).spec
    assert "rank0.json" in spec.device.efficiency.kernel_overhead_s.provenance
    assert spec.device.efficiency.by_op and "sgd_:O" in spec.device.efficiency.by_op

    rc, out, err = run_main(capsys, "validate", plan, "--cluster", str(cal), "--steps", "2",
                            "--repeats", "1", "--no-verify", "--json", "--csv", csv)
    assert rc == 0, err
    assert json.loads(out)["predicted_step_time_ms"] == pytest.approx(after, rel=1e-3)

    load = got["host_load"]
    worst = max(load["before"], load["after"])
    error = (after - measured) / measured
    print(f"measured {measured:.1f} ms (traced run {traced:.1f}), predicted before {before:.1f} ms "
          f"({(before - measured) / measured:+.1%}), after {after:.1f} ms ({error:+.1%}); load "
          f"{worst:.2f} on {load['cores']} cores; {slow} (the {BAND:.0%} band is issue 19's open item)")
    assert after > 0 and before > 0
