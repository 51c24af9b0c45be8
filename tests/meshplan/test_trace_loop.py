"""The calibration loop of a real CPU executor trace, through the CLI (issue 19): a shrunk
LLaMA (2 layers, hidden 128) on 2 gloo ranks runs under ``meshplan validate
--profile-trace`` (each rank, after its timed steps, records a short ``torch.profiler``
pass with shapes and then rounds of one unrecorded step and one step whose plan ops are
timed by the span recorder, ``executor.profile``), ``meshplan calibrate --from-trace`` fits
the plan's cluster to the recorded steps, and ``meshplan validate --cluster`` predicts with
the fitted YAML (the README's three commands). Asserted: the traces hold what the fit
needs (aten GEMMs with shapes, the recorder's named spans, both step series), the
recorder costs under 3% of a step, the measured step calibrate prints is the median of the
unrecorded rounds (recomputed here from the traces), the fit is written with its
provenance and the optimizer op's rate, and the second validate predicts exactly what
calibrate printed.

The 10% band of the re-predicted step is asserted in ``benchmarks/bench_trace_loop.py``
(8 trials, each waiting for the host's load to fall below its 2 cores; results in
``benchmarks/RESULTS.md``), not here: with the full suite on 2 pytest workers and other
work on this 2-core host the load reaches 5 to 8, the steps of one run then range over
2.5x, and with 9 rounds (31 since) the medians of the unrecorded and the recorded steps of
one run differed by up to 18% on their own (measured, issue 19: 6 of 8 runs within 10% at loads of 5 to 6); the
test prints the error (``-s``)."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from tests._cli import run_main

MODEL = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 352, "vocab_size": 1000,
         "max_position_embeddings": 64}
STEP = re.compile(r"step \(ms\): measured ([\d.]+) .*predicted before ([\d.]+) \(.*\), after ([\d.]+)")
RECORDED = re.compile(r"recorded steps: median ([\d.]+) ms vs ([\d.]+) ms unrecorded.*accounts for "
                      r"\+?(-?[\d.]+)%")
#: the target of issue 19 (asserted by benchmarks/bench_trace_loop.py): the re-predicted
#: step within 10% of the measured one
BAND = 0.10


def loop_plan(tmp_path) -> str:
    """The loop's plan (``MODEL`` dp 2, fp32, SGD, micro-batch 2, global batch 8, sequence
    64) saved as ``tmp_path/plan.json``; returns its path."""
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy

    cfg = tmp_path / "llama-tiny.json"
    cfg.write_text(json.dumps(MODEL))
    s = Strategy(dp=2, dtype="float32", optimizer="sgd", micro_batch_size=2, global_batch_size=8)
    return str(Plan(str(cfg), "cpu-local", s, seq_len=64).save(tmp_path / "plan.json"))


@pytest.mark.slow
@pytest.mark.distributed
def test_calibration_loop_from_an_executor_trace(tmp_path, capsys):
    from executor.profile import GRAD_SCALE_LABEL, PAIRED_STEPS, PROFILE_STEPS
    from executor.span_trace import SPAN_CAT

    plan, traces, cal = loop_plan(tmp_path), tmp_path / "traces", tmp_path / "fitted.yaml"
    csv = str(tmp_path / "v.csv")
    rc, out, err = run_main(capsys, "validate", plan, "--steps", "5", "--repeats", "1", "--no-verify",
                            "--json", "--csv", csv, "--profile-trace", str(traces))
    assert rc == 0, err
    got = json.loads(out)
    metas = []
    for r in (0, 1):  # one trace per rank: the profiler pass with shapes, then the recorded rounds
        doc = json.loads((traces / f"rank{r}.json").read_text())
        meta = doc["meshplan"]
        metas.append(meta)
        assert meta["rank"] == r and len(meta["step_times_s"]) == 5
        assert len(meta["profiled_steps_s"]) == PROFILE_STEPS
        assert len(meta["paired_steps_s"]) == len(meta["span_steps_s"]) == PAIRED_STEPS
        mm = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"]
        assert mm and all(e["args"]["Input Dims"] for e in mm)
        spans = [e for e in doc["traceEvents"] if e.get("cat") == SPAN_CAT]
        assert sum(e["name"] == "meshplan::O bucket0 all_reduce" for e in spans) == PAIRED_STEPS
        assert sum(e["name"].startswith("meshplan-step ") for e in spans) == PAIRED_STEPS
        # m = 2: the 1/m gradient scaling in a span of its own, out of the uncovered host time
        assert sum(e["name"] == GRAD_SCALE_LABEL for e in spans) == PAIRED_STEPS
    assert got["profile_trace"] == str(traces)

    rc, out, err = run_main(capsys, "calibrate", "--from-trace", str(traces), "--plan", plan,
                            "-o", str(cal))
    assert rc == 0, err
    assert "kernel class" in out and "gemm" in out and "collective" in out
    m, rec = STEP.search(out), RECORDED.search(out)
    assert m and rec, out
    traced, before, after = (float(x) for x in m.groups())
    same_run = statistics.median(max(x["paired_steps_s"][i] for x in metas) for i in range(PAIRED_STEPS))
    assert traced == pytest.approx(same_run * 1e3, abs=1e-3)
    assert float(rec.group(2)) == pytest.approx(traced, abs=1e-3)
    assert 0.0 <= float(rec.group(3)) < 3.0  # the recorder's cost, % of the step
    assert "CPU time of the ranks' threads: median" in out
    # the executor's host time between its spans, folded into the per-action overhead
    # (executor.trace_rounds): a few percent of the recorded step, never negative
    gap = re.search(r"host time outside the recorded spans: median ([\d.]+) ms", out)
    assert gap and 0.0 <= float(gap.group(1)) < 0.25 * float(rec.group(1)), out
    from executor.trace_rounds import middle_rounds

    pooled = middle_rounds(metas)
    assert len(pooled) == -(-PAIRED_STEPS // 3) | 1  # a third of the rounds, odd
    assert f"the middle {len(pooled)} of {PAIRED_STEPS} recorded rounds by time" in out
    # both ranks ran on this host and recorded their clock origin: the rounds are lined up
    assert len({x["host"] for x in metas}) == 1 and all(x["span_origin_ns"] > 0 for x in metas)
    assert "ranks' start of each recorded step (one host's clock): up to" in out
    from clusters import load_cluster

    spec = load_cluster(str(cal)).spec
    assert "rank0.json" in spec.device.efficiency.kernel_overhead_s.provenance
    assert spec.device.efficiency.by_op and "sgd_:O" in spec.device.efficiency.by_op

    rc, out, err = run_main(capsys, "validate", plan, "--cluster", str(cal), "--steps", "2",
                            "--repeats", "1", "--no-verify", "--json", "--csv", csv, "--append")
    assert rc == 0, err
    assert json.loads(out)["predicted_step_time_ms"] == pytest.approx(after, rel=1e-3)

    load = got["host_load"]
    worst = max(load["before"], load["after"])
    error = (after - traced) / traced
    print(f"measured {traced:.1f} ms (unrecorded rounds of the traced run; validate's median of "
          f"repeats {got['measured_step_time_ms']:.1f}), predicted before {before:.1f} ms "
          f"({(before - traced) / traced:+.1%}), after {after:.1f} ms ({error:+.1%}); recorded steps "
          f"{rec.group(1)} ms; load {worst:.2f} on {load['cores']} cores (the {BAND:.0%} band: "
          f"benchmarks/bench_trace_loop.py)")
    assert after > 0 and before > 0

    # edited copies of the real traces: each defect is one error naming the file and what is
    # wrong (nothing written), a rank missing is a warning, one rank's file alone is read
    # as an executor trace (its metadata sits after 7 MB of events)
    _edited_traces_are_refused(tmp_path, plan, traces, pooled, capsys)


def _edit(src, dst, rank: int, change) -> None:
    import shutil

    shutil.copytree(src, dst)
    doc = json.loads((dst / f"rank{rank}.json").read_text())
    change(doc)
    (dst / f"rank{rank}.json").write_text(json.dumps(doc))


def _edited_traces_are_refused(tmp_path, plan, traces, pooled, capsys) -> None:
    from executor.profile import step_label
    from tests._cli import one_line_error

    def calibrate(src, out="bad.yaml"):
        return run_main(capsys, "calibrate", "--from-trace", str(src), "--plan", plan, "-o",
                        str(tmp_path / out))

    def nan_rounds(doc):
        doc["meshplan"]["span_steps_s"][3] = float("nan")

    def cut_step(doc):  # the pooled round's step span half as long: ops fall out of it
        step = next(e for e in doc["traceEvents"] if e.get("name") == step_label(pooled[1]))
        step["dur"] /= 2

    def as_rank0(doc):
        doc["meshplan"]["rank"] = 0

    _edit(traces, tmp_path / "nan", 1, nan_rounds)
    line = one_line_error(*calibrate(tmp_path / "nan"))
    assert "rank1.json: metadata field 'span_steps_s'" in line and "finite" in line
    _edit(traces, tmp_path / "cut", 0, cut_step)
    line = one_line_error(*calibrate(tmp_path / "cut"))
    assert "rank0.json: round " in line and "other plan ops than round" in line
    _edit(traces, tmp_path / "dup", 1, as_rank0)
    assert "both are traces of rank 0" in one_line_error(*calibrate(tmp_path / "dup"))
    assert not (tmp_path / "bad.yaml").exists()
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "rank0.json").write_bytes((traces / "rank0.json").read_bytes())
    rc, out, err = calibrate(tmp_path / "one", "one.yaml")
    assert rc == 0 and "no trace of rank(s) [1] of world size 2" in err, err
    rc, out, err = calibrate(tmp_path / "one" / "rank0.json", "file.yaml")
    assert rc == 0 and "executor trace(s)" in out and "plan ops matched per round" in out, out
