"""``meshplan export``: each target's output parsed by a parser written from that framework's
documented names (``tests/_export_parsers.py``), and the parsed layout compared with the
plan's; hand-derived outputs of known plans; the command's errors and notes."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings

from meshplan.commands import export as export_cmd_module
from meshplan.frameworks.megatron.export import pipeline_layout
from meshplan.frameworks.targets import TARGETS, ExportError, export_plan, layout
from meshplan.frameworks.torchtitan.export import even_split, module_fqns
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main
from tests._export_parsers import (
    check_round_trip,
    megatron_parser,
    parse_layout_string,
    parse_megatron,
    plans,
)

ROOT = Path(__file__).resolve().parents[2]



@settings(max_examples=20, deadline=None, derandomize=True)
@given(plan=plans())
def test_export_round_trip_of_random_plans_equals_the_plans_layout(plan):
    """export -> parse with the framework-style parser -> the layout the target runs; it
    equals the plan's wherever no note says otherwise, and Megatron-LM (whose knobs are
    meshplan's) reproduces the plan's parallel layout, batch, ZeRO and dtype exactly."""
    for target in TARGETS:
        check_round_trip(plan, target)
    want = layout(plan)
    parsed = parse_megatron(export_plan(plan, "megatron").text, plan.strategy.world_size)
    for k in ("dp", "tp", "micro_batch_size", "global_batch_size", "zero", "fsdp_shard_size",
              "sequence_parallel", "dtype", "num_layers", "pp"):
        assert parsed[k] == want[k], k
    if plan.strategy.pp > 1:
        assert (parsed["vpp"], parsed["layers_per_stage"]) == (want["vpp"], want["layers_per_stage"])


# -- hand-derived outputs -------------------------------------------------------------------

def _plan(**kw) -> Plan:
    base = dict(dp=2, tp=2, pp=4, vpp=2, schedule="VPP", micro_batch_size=1, global_batch_size=16,
                recompute="full", zero=1, sequence_parallel=True)
    base.update(kw)
    return Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=Strategy(**base), nodes=4)


def test_megatron_arguments_of_a_known_plan():
    """llama2-7b (32 layers), tp2 pp4 vpp2 dp2: 32 / (4 x 2) = 4 layers per virtual stage;
    m = 16 / (2 x 1) = 8 micro-batches is Megatron's to derive from the batch sizes."""
    text = export_plan(_plan(), "megatron").text
    argv = shlex.split(" ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.startswith("#")))
    assert argv == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
                    "--num-layers-per-virtual-pipeline-stage", "4", "--sequence-parallel",
                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1", "--use-distributed-optimizer",
                    # the megatron-core profile costs these overlaps, which Megatron-LM leaves off
                    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--bf16",
                    "--optimizer", "adam", "--micro-batch-size", "1", "--global-batch-size", "16",
                    "--num-layers", "32", "--seq-length", "4096"]
    assert "dp 2 = 16 / (tp 2 x pp 4 x cp 1)" in text


def test_megatron_layout_string_of_an_uneven_split():
    assert pipeline_layout((3, 0, 2)) == "E,t*3||t*2,L"
    assert pipeline_layout((0, 1)) == "E|t,L"
    assert parse_layout_string("E,t*3||t*2,L") == [["E", "t", "t", "t"], [], ["t", "t", "L"]]
    out = export_plan(_plan(pp=2, vpp=1, schedule="1F1B", layers_per_stage=(5, 3)), "megatron")
    assert "--pipeline-model-parallel-layout 'E,t*5|t*3,L'" in out.text


def test_megatron_notes_what_it_cannot_run():
    out = export_plan(_plan(pp=2, vpp=1, schedule="ZBH1", recompute="selective-op",
                            optimizer="adam"), "megatron")
    assert {n.knob for n in out.notes} == {"schedule", "recompute", "optimizer"}
    assert out.effective["schedule"] == "1F1B" and out.effective["recompute"] == "selective"


def test_a_nemo_plan_exported_to_megatron_lm_is_noted():
    """A plan costed under the nemo profile (Apex DistributedFusedAdam: bf16 gradients,
    fp32 masters as 16-bit remainders) runs differently under Megatron-LM's pretrain_gpt.py
    (fp32 gradients with bf16, whole masters: 6 + 12/N bytes a parameter against 4 + 10/N),
    so the export says to re-cost it."""
    out = export_plan(_plan(framework="nemo"), "megatron")
    note = [n for n in out.notes if n.knob == "framework"]
    assert note and "'nemo' profile" in note[0].text and "megatron-core" in note[0].text
    assert not [n for n in export_plan(_plan(), "megatron").notes if n.knob == "framework"]


def test_bf16_gradients_of_the_profile_are_asked_of_megatron_lm():
    """Megatron-LM d98e8a64 keeps fp32 main gradients with --bf16 (arguments.py:
    accumulate_allreduce_grads_in_fp32 = not grad_reduce_in_bf16); a plan costed with bf16
    gradients (megatron-bridge: grad_reduce_in_fp32 False) asks for them, so the run reduces
    2 bytes a gradient as predicted, not 4. megatron-core's fp32 default writes nothing; an
    fp32 plan has no bf16 to reduce in."""
    def flag(**kw):
        text = export_plan(_plan(**kw), "megatron").text
        parse_megatron(text, 16)  # the whole text parses as Megatron-LM's arguments
        body = [ln for ln in text.splitlines() if not ln.startswith("#")]
        argv = shlex.split(" ".join(ln.rstrip("\\") for ln in body))
        return megatron_parser().parse_args(argv).grad_reduce_in_bf16

    assert flag(framework="megatron-bridge") and flag(framework="nemo")
    assert not flag() and not flag(framework="megatron-core")
    assert not flag(framework="megatron-bridge", dtype="float32")


def test_torchtitan_toml_of_a_known_plan():
    """ZeRO 3 dp2 -> data_parallel_shard_degree 2; pp4: local batch 16 / 2 = 8 split into
    micro-batches of 1; vpp 3 with 32 layers: an even split 3,3,3,3,3,3,3,3,2,2,2,2 of
    12 stages, listed as modules."""
    out = export_plan(_plan(vpp=3, zero=3, recompute="selective-op"), "torchtitan")
    doc = tomllib.loads(out.text)
    assert doc["training"] == {"local_batch_size": 8, "global_batch_size": 16, "seq_len": 4096,
                               "mixed_precision_param": "bfloat16"}
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 2)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert [len([m for m in p if m.startswith("layers.")]) for p in par["module_fqns_per_model_part"]] \
        == [3] * 8 + [2] * 4
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "layers_per_stage" in {n.knob for n in out.notes}
    assert even_split(32, 12) == (3,) * 8 + (2,) * 4
    assert module_fqns((1, 0, 1)) == [["tok_embeddings", "layers.0"], [], ["layers.1", "norm", "output"]]


def test_deepspeed_json_of_a_known_plan():
    """global 16 = micro 1 x 8 accumulation steps x dp 2; under AutoTP train_batch_size is
    left for DeepSpeed to derive (noted); pp is a script setting (noted)."""
    out = export_plan(_plan(pp=1, vpp=1, schedule="1F1B", zero=2), "deepspeed")
    cfg = json.loads(out.text)
    assert "train_batch_size" not in cfg and cfg["gradient_accumulation_steps"] == 8
    assert cfg["train_micro_batch_size_per_gpu"] == 1
    assert "global_batch_size" in {n.knob for n in out.notes}
    dense = json.loads(export_plan(_plan(tp=1, pp=1, vpp=1, schedule="1F1B", sequence_parallel=False),
                                   "deepspeed").text)
    assert dense["train_batch_size"] == 16 and "tensor_parallel" not in dense
    assert cfg["zero_optimization"] == {"stage": 2} and cfg["tensor_parallel"] == {"autotp_size": 2}
    assert cfg["bf16"] == {"enabled": True} and "activation_checkpointing" in cfg
    assert "sequence_parallel" in {n.knob for n in out.notes}
    pp_out = export_plan(_plan(), "deepspeed")
    assert any(n.knob == "pp" and "num_stages=4" in n.text for n in pp_out.notes)


def test_a_custom_intra_op_layout_is_noted_by_every_target():
    plan = _plan(annotation={"embedding.weight": ["Replicate()", "Shard(0)"]})
    for target in TARGETS:
        assert "annotation" in {n.knob for n in export_plan(plan, target).notes}, target
        assert "annotation" not in {n.knob for n in export_plan(_plan(), target).notes}, target


def test_unknown_target_is_refused():
    with pytest.raises(ExportError, match="unknown export target 'nemo'"):
        export_plan(_plan(), "nemo")


def test_cli_targets_agree_with_the_registry():
    assert [t.value for t in export_cmd_module.Target] == list(TARGETS)


def test_export_command_writes_the_file_and_prints_notes(tmp_path, capsys):
    plan_path = _plan(recompute="selective-op").save(tmp_path / "plan.json")
    out = tmp_path / "out" / "args.txt"
    code, stdout, stderr = run_main(capsys, "export", str(plan_path), "--to", "megatron", "-o", str(out))
    assert code == 0, stderr
    assert "note: recompute:" in stderr and out.read_text().startswith("# Megatron-LM arguments")
    code, stdout, stderr = run_main(capsys, "export", str(plan_path), "--to", "deepspeed")
    assert code == 0 and json.loads(stdout)["train_micro_batch_size_per_gpu"] == 1
    code, _, stderr = run_main(capsys, "export", str(plan_path), "--to", "nemo")
    assert code == 2 and "nemo" in stderr
    line = one_line_error(*run_main(capsys, "export", str(tmp_path / "missing.json"), "--to", "megatron"))
    assert "plan file not found" in line


def test_context_parallel_plan_exports():
    """cp 2: Megatron's --context-parallel-size and torchtitan's context_parallel_degree; the
    launch covers dp x tp x pp x cp ranks; DeepSpeed (no ring attention) says so in a note."""
    s = Strategy(dp=2, tp=2, cp=2, global_batch_size=8)
    plan = Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, seq_len=4096)
    meg = export_plan(plan, "megatron")
    assert "--context-parallel-size 2" in meg.text and "dp 2 = 8 / (tp 2 x pp 1 x cp 2)" in meg.text
    assert parse_megatron(meg.text, 8)["cp"] == 2
    tt = export_plan(plan, "torchtitan")
    assert tomllib.loads(tt.text)["parallelism"]["context_parallel_degree"] == 2
    # the ring is alltoall in torchtitan (its default allgather is the other variant), and
    # the all_gather variant is Megatron's --cp-comm-type allgather (both dropped before)
    assert tomllib.loads(tt.text)["parallelism"]["context_parallel_rotate_method"] == "alltoall"
    ag = Plan(model="llama2-7b", cluster="dgx-h100", strategy=s.replace(cp_comm="all_gather"), nodes=1)
    assert tomllib.loads(export_plan(ag, "torchtitan").text)["parallelism"][
        "context_parallel_rotate_method"] == "allgather"
    assert "--cp-comm-type allgather" in export_plan(ag, "megatron").text
    assert "--cp-comm-type" not in meg.text
    ds = export_plan(plan, "deepspeed")
    assert ds.effective["cp"] == 1 and [n.knob for n in ds.notes if n.knob == "cp"] == ["cp"]


def test_hsdp_plan_exports_to_each_target():
    """HSDP dp 16 = 2 replicas x 8 shards: torchtitan replicate 2 x shard 8; Megatron-FSDP
    2 distributed-optimizer instances (outer dp, no_shard); DeepSpeed MiCS shard size 8,
    with a note. Each parser reads the shard group back."""
    s = Strategy(dp=16, global_batch_size=64, zero=3, fsdp_shard_size=8, framework="fsdp2")
    plan = Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s)
    tt = export_plan(plan, "torchtitan")
    par = tomllib.loads(tt.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (2, 8)
    meg = export_plan(plan, "megatron")
    assert "--num-distributed-optimizer-instances 2" in meg.text
    assert "--outer-dp-sharding-strategy no_shard" in meg.text
    ds = export_plan(plan, "deepspeed")
    # DeepSpeed 0.19.8 refuses MiCS's mics_shard_size: ZeRO-3 over all dp, noted
    assert json.loads(ds.text)["zero_optimization"] == {"stage": 3}
    assert "fsdp_shard_size" in {n.knob for n in ds.notes}
    for target in TARGETS:
        assert check_round_trip(plan, target)["fsdp_shard_size"] == (None if target == "deepspeed" else 8), target


def test_fp8_plans_export_their_recipe_or_say_why_not():
    """An FP8 plan is never exported silently as BF16: Megatron-LM writes Transformer
    Engine's recipe (delayed scaling with the modelled 1024-step max amax history, or
    tensorwise current scaling), torchtitan torchao's float8 converter (tensorwise /
    rowwise, head and FSDP all-gather in BF16 as costed); what a target cannot run is a note."""
    te = Plan(model="llama2-7b", cluster="dgx-h100",
              strategy=Strategy(dp=8, global_batch_size=64, dtype="fp8-delayed"))
    mg = export_plan(te, "megatron")
    assert "--fp8-format hybrid" in mg.text and "--fp8-recipe delayed" in mg.text
    assert "--fp8-amax-history-len 1024" in mg.text and mg.effective["fp8"] == "te-delayed"
    for target in ("torchtitan", "deepspeed"):
        out = export_plan(te, target)
        assert out.effective["fp8"] is None and "fp8" in {n.knob for n in out.notes}, target
    tw = Plan(model="llama2-7b", cluster="dgx-h100",
              strategy=Strategy(dp=8, global_batch_size=64, zero=3, framework="fsdp2",
                                dtype="fp8-rowwise"))
    tt = export_plan(tw, "torchtitan")
    doc = tomllib.loads(tt.text)
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"] == {"recipe_name": "rowwise", "filter_fqns": ["output"],
                                                   "enable_fsdp_float8_all_gather": False}
    mg = export_plan(tw, "megatron")
    assert "--fp8" not in mg.text and "fp8" in {n.knob for n in mg.notes}
    for plan in (te, tw):
        for target in TARGETS:
            check_round_trip(plan, target)


def test_torchtitan_compile_and_async_tp_follow_the_profile():
    """fsdp2 is costed compiled: [compile] enable; fsdp2-eager is not; fsdp2-async-tp with tp 2
    also turns on parallelism.enable_async_tensor_parallel, and with tp 1 notes why not."""
    docs = {fw: tomllib.loads(export_plan(_plan(framework=fw), "torchtitan").text)
            for fw in ("fsdp2", "fsdp2-eager", "fsdp2-async-tp")}
    assert docs["fsdp2"]["compile"] == {"enable": True, "components": ["model"]}
    assert "compile" not in docs["fsdp2-eager"]
    assert "enable_async_tensor_parallel" not in docs["fsdp2"]["parallelism"]
    assert docs["fsdp2-async-tp"]["parallelism"]["enable_async_tensor_parallel"] is True
    out = export_plan(_plan(framework="fsdp2-async-tp", tp=1, sequence_parallel=False), "torchtitan")
    assert "enable_async_tensor_parallel" not in tomllib.loads(out.text)["parallelism"]
    assert any(n.knob == "framework" and "tp > 1" in n.text for n in out.notes)


def test_the_command_refuses_what_cost_refuses_and_exports_the_costed_split(tmp_path, capsys):
    """Found by a bad-input hunt: export turned layouts ``cost`` refuses into launch
    arguments. Now the command runs cost's checks first (each error names the field), and a
    plan without a layer split exports the split that was costed: llama2-7b's 32 layers on
    pp 4 x vpp 3 do not divide (Megatron's get_num_layers_to_build refuses 8 % 3), so the
    Megatron arguments carry the costed 12-stage layout, whose stages sum to 32."""
    tiny = str(ROOT / "benchmarks" / "plans" / "llama_l2.json")  # 2 layers, 4 heads
    base = ["export", "--to", "megatron", "--cluster", "dgx-h100", "--global-batch", "2"]
    for extra, what in ((["--tp", "3"], "--tp = 3 does not divide"), (["--pp", "4"], "cannot fill 4 pipeline"),
                        (["--dp", "2", "--cp", "3"], "--cp = 3")):
        line = one_line_error(*run_main(capsys, *base, "--model", tiny, *extra))
        assert what in line, line
    line = one_line_error(*run_main(capsys, "export", "--to", "megatron", "--cluster", "dgx-h100",
                                    "--global-batch", "64", "--model", "llama2-7b", "--dp", "64"))
    assert "= 64 ranks exceeds cluster 'dgx-h100' with 8" in line
    code, out, err = run_main(capsys, "export", "--to", "megatron", "--model", "llama2-7b", "--cluster", "dgx-h100",
                              "--global-batch", "64", "--seq-len", "1024", "--pp", "4", "--vpp", "3",
                              "--schedule", "VPP", "--dp", "2")
    assert code == 0, err
    layout_arg = re.search(r"--pipeline-model-parallel-layout '([^']*)'", out).group(1)
    stages = layout_arg.split("|")
    assert len(stages) == 12
    assert sum(int(t.split("*")[1]) if "*" in t else 1 for st_ in stages for t in st_.split(",")
               if t.startswith("t")) == 32
    # validate --launcher torchrun refuses such a plan too, before printing a command
    bad = Plan(model=tiny, cluster="dgx-h100", strategy=Strategy(tp=3, global_batch_size=2)).save(tmp_path / "p.json")
    line = one_line_error(*run_main(capsys, "validate", str(bad), "--launcher", "torchrun"))
    assert "'tp' = 3 does not divide" in line


def test_export_names_the_flags_as_typed_and_notes_an_out_of_memory_plan(capsys):
    """Found by a new-user check: export's refusals named strategy fields where cost names
    the flags as typed, and a plan cost calls OUT OF MEMORY was exported without a word."""
    base = ["export", "--to", "megatron", "--cluster", "dgx-a100-80g"]
    line = one_line_error(*run_main(capsys, *base, "--model", "llama2-7b", "--tensor-model-parallel-size", "3",
                                    "--dp", "1", "--global-batch", "8"))
    assert line.startswith("error: --tensor-model-parallel-size = 3 does not divide")
    # a job that does not fit is an error (issue 39), unless --force
    line = one_line_error(*run_main(capsys, *base, "--model", "llama2-70b", "--dp", "8", "--global-batch", "8"))
    assert line.startswith("error: the exported job does not fit as megatron runs it: peak ")
    code, out, err = run_main(capsys, *base, "--model", "llama2-70b", "--dp", "8", "--global-batch", "8",
                              "--force")
    assert code == 0 and "--tensor-model-parallel-size 1" in out
    assert "note: OUT OF MEMORY as costed: the plan needs" in err and "GiB limit" in err


def test_torchrun_command_keeps_one_rank_per_gpu(tmp_path, capsys):
    """Found by a new-user check: a dp 32 plan on 4 nodes of 8 GPUs printed
    ``--nproc-per-node 32`` for --nnodes 1."""
    p = Plan(model="llama2-7b", cluster="dgx-a100-80g", nodes=4, seq_len=4096,
             strategy=Strategy(dp=32, global_batch_size=512, zero=1)).save(tmp_path / "p.json")
    line = one_line_error(*run_main(capsys, "validate", str(p), "--launcher", "torchrun", "--nnodes", "1"))
    assert "32 ranks a node, but a node of cluster 'dgx-a100-80g' has 8 GPUs (one rank each); use --nnodes 4" in line
    code, out, _ = run_main(capsys, "validate", str(p), "--launcher", "torchrun", "--nnodes", "4")
    assert code == 0 and "--nnodes 4 --nproc-per-node 8" in out


def test_output_paths_it_cannot_write_are_one_line_naming_the_option(tmp_path, capsys):
    """export -o on a folder, under a file, on a full device; tune --output on a file: one
    `error:` line naming --output (they printed the bare errno text: "Is a directory: adir")."""
    from tests._cli import one_line_error, run_main

    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    base = ["export", "--to", "megatron", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8",
            "--global-batch", "8", "-o"]
    cases = [(str(tmp_path / "adir"), "is a directory; give a file name"),
             (str(tmp_path / "afile" / "x"), "a file is in the way of the folder it needs")]
    if Path("/dev/full").exists():
        cases.append(("/dev/full", "is not a regular file"))  # refused before the work (issue 43)
    for out, needle in cases:  # (a note on the plan's memory may come first)
        rc, _, err = run_main(capsys, *base, out)
        line = err.strip().splitlines()[-1]
        assert rc == 2 and "Traceback" not in err and line.startswith("error: --output ") and needle in line, err
    line = one_line_error(*run_main(capsys, "tune", "-m", "llama2-7b", "--cluster", "dgx-h100",
                                    "--global-batch", "8", "--trials", "2", "--output", str(tmp_path / "afile")))
    assert "--output" in line and "a file is in the way" in line


def test_an_even_split_exported_beside_a_balanced_costed_one_is_costed_and_said(capsys):
    """8 layers on pp 2: the cost model balances the stages beside the embedding and the
    loss and costs [5, 3]; Megatron-LM runs its even 4 / 4 (the exported arguments), a
    different plan in time and memory. The export says so with both splits costed."""
    from meshplan import Engine, Strategy
    from tests._cli import run_main

    s = Strategy(dp=4, pp=2, ep=4, micro_batch_size=1, global_batch_size=16, zero=1)
    bal = Engine("qwen3-30b-a3b", "dgx-h100", s, seq_len=2048, num_layers=8).simulate()
    even = Engine("qwen3-30b-a3b", "dgx-h100", s.replace(layers_per_stage=(4, 4)), seq_len=2048,
                  num_layers=8).simulate()
    split = list(bal.layers_per_vstage)
    assert sum(split) == 8 and len(set(split)) > 1
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "qwen3-30b-a3b", "--cluster", "dgx-h100",
                            "--dp", "4", "--pp", "2", "--ep", "4", "--global-batch", "16", "--seq-len", "2048",
                            "--layers", "8", "--zero", "1")
    assert rc == 0, err
    assert "--pipeline-model-parallel-layout" not in out
    assert (f"the cost model balanced the stages as {split} ({bal.step_time * 1e3:.1f} ms a step" in err
            and f"splits the layers evenly, [4, 4], as exported: {even.step_time * 1e3:.1f} ms" in err)


def test_a_schedule_the_framework_does_not_run_is_costed_as_it_runs(capsys):
    """A hunt exported a tuned ZBVPP plan to Megatron-LM, which runs interleaved 1F1B: the
    notes gave the ZBVPP figures as the prediction. The schedule note now costs the plan as
    the framework runs it, equal to ``meshplan cost`` of that layout (the even split the
    exporters write), beside the plan's own figures; in the file too."""
    from tests._cli import run_main

    base = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "4", "--pp", "2",
            "--global-batch", "64", "--layers", "8", "--seq-len", "4096")
    rc, out, _ = run_main(capsys, "cost", *base, "--vpp", "2", "--schedule", "VPP",
                          "--layers-per-stage", "even", "--json")
    vpp_ms = json.loads(out)["step_time_ms"]
    rc, out, _ = run_main(capsys, "cost", *base, "--vpp", "2", "--schedule", "ZBVPP", "--json")
    zbv_ms = json.loads(out)["step_time_ms"]
    rc, out, _ = run_main(capsys, "cost", *base, "--layers-per-stage", "even", "--json")
    one_ms = json.loads(out)["step_time_ms"]
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--vpp", "2", "--schedule", "ZBVPP")
    assert rc == 0, err
    want = f"schedule: as Megatron-LM runs it (VPP): {vpp_ms:.1f} ms a step"
    assert want in err and f"the plan's ZBVPP: {zbv_ms:.1f} ms" in err and "# note: " + want in out
    rc, out, err = run_main(capsys, "export", "--to", "deepspeed", *base, "--vpp", "2", "--schedule", "VPP")
    assert rc == 0, err
    assert f"as DeepSpeed runs it (1F1B with 1 chunk(s) per rank): {one_ms:.1f} ms a step" in err
    assert f"the plan's VPP (vpp 2): {vpp_ms:.1f} ms" in err
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--vpp", "2", "--schedule", "VPP")
    assert rc == 0 and "as Megatron-LM runs it" not in err  # the plan's own schedule: nothing to say


def test_the_as_run_note_says_when_the_framework_cannot_run_it_or_it_does_not_fit(capsys):
    """A review: a ZBVPP plan of 5 micro-batches on pp 4 exports to Megatron-LM, whose
    interleaved 1F1B needs a multiple of pp: the as-run costing raised and stopped the
    export. It is now a note saying why; an as-run peak over the limit says OUT OF MEMORY."""
    from tests._cli import run_main

    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-7b", "--cluster",
                            "dgx-h100", "--nodes", "1", "--dp", "2", "--pp", "4", "--vpp", "2",
                            "--schedule", "ZBVPP", "--global-batch", "10")
    assert rc == 0, err
    flat = " ".join(err.split())
    assert "schedule: Megatron-LM cannot run this plan as VPP: " in flat and "needs a multiple of pp = 4" in flat
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-13b", "--cluster",
                            "dgx-h100", "--nodes", "1", "--dp", "1", "--tp", "2", "--pp", "4", "--vpp",
                            "2", "--schedule", "ZBVPP", "--micro-batch-size", "2", "--global-batch", "16",
                            "--force")
    assert rc == 0, err
    line = next(ln for ln in err.splitlines() if "as Megatron-LM runs it" in ln)
    peak = float(re.search(r"runs it \(VPP\): [\d.]+ ms a step, peak ([\d.]+) GiB", line).group(1))
    assert peak > 75.67 and "OUT OF MEMORY (75.67 GiB limit)" in line
