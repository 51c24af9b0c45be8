"""Nothing the user gives is ignored (issue 43, item 3): an option without effect in its
combination is refused (or, where the input is still meaningful, warned about), a
repeated option is refused, and YAML is read with one meaning per scalar."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml

import clusters
from clusters import strict_yaml
from clusters.catalog import CATALOG_DIR
from tests._cli import one_line_error, run_main

COST = ["cost", "-m", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "8", "--layers", "2"]
TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--trials", "2", "--storage", "memory"]
SIM = ["simulate", "--schedule", "1F1B", "--microbatches", "4", "--tf", "1", "--tb", "1"]


@pytest.mark.parametrize(("argv", "twice"), [
    (COST, ["--dp", "2", "--dp", "8"]),
    (COST[:1] + COST[3:], ["-m", "llama2-7b", "--model", "llama2-13b"]),
    (COST, ["--dp", "8", "--zero", "1", "--zero-stage", "2"]),  # two spellings of one option
    (SIM, ["--stages", "2", "--stages", "4"]),
    (TUNE, ["--seed", "1", "--seed=2"]),
    (["export", "--to", "megatron", *COST[1:], "--dp", "8"], ["--to", "deepspeed"]),
    (["calibrate", "-o", "x.yaml"], ["--nproc", "2", "--nproc", "3"]),
    (["validate", "benchmarks/plans/dp2.json"], ["--steps", "2", "--steps", "3"]),
    (["clusters", "show", "dgx-h100"], ["--nodes", "1", "--nodes", "2"]),
])
def test_an_option_given_twice_with_two_values_is_refused(capsys, argv, twice):
    """click kept the last value in silence (``--dp 2 --dp 8`` costed dp 8)."""
    line = one_line_error(*run_main(capsys, *argv, *twice))
    assert "given twice with different values" in line or "set the same thing" in line
    assert twice[-2].split("=")[0] in line or twice[-1].split("=")[0] in line


def test_an_option_repeated_with_its_value_is_one_setting(capsys):
    rc, _, err = run_main(capsys, *COST, "--dp", "8", "--dp", "8")
    assert rc == 0, err
    rc, _, err = run_main(capsys, *COST, "--dp", "4", "--tp", "2", "--tensor-model-parallel-size", "2")
    assert rc == 0, err


@pytest.mark.parametrize(("extra", "needle"), [
    (["--vpp", "2", "--pp", "1"], "--vpp 2 needs pp > 1"),
    (["--fix", "pp=1,vpp=2"], "--fix vpp=2 needs pp > 1"),
    (["--pp", "1", "--schedule", "VPP"], "--schedule VPP interleaves a pipeline's chunks, and --pp 1"),
    (["--objective", "time"], "--objective time picks among cluster sizes"),
    (["--objective", "cost"], "--objective cost picks among cluster sizes"),
    (["--fix", ""], "--fix '' has an empty item"),
    (["--fix", "tp=2,"], "has an empty item"),
    (["--output", ""], "--output is empty"),
])
def test_tune_refuses_options_that_cannot_act(tmp_path, capsys, extra, needle):
    line = one_line_error(*run_main(capsys, *TUNE, *[a for a in extra]))
    assert needle in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "needle"), [
    (["calibrate", "-o", "c.yaml", "--plan", "p.json"], "--plan applies only with --from-trace"),
    (["calibrate", "-o", "c.yaml", "--plan", "p.json", "--cluster", "dgx-h100"],
     "--plan and --cluster apply only with --from-trace"),
    (["calibrate", "-o", "c.yaml", "--from-trace", "t.json", "--plan", "p.json", "--quick"],
     "--quick applies only to a measurement"),
    ([*COST, "--dp", "8", "--schedule", "VPP"], "--schedule VPP orders the micro-batches of a pipeline"),
    ([*COST, "--dp", "8", "--schedule", "ZBH1"], "pp 1 has none"),
])
def test_options_of_another_mode_or_of_a_pipeline_are_refused(tmp_path, monkeypatch, capsys, argv, needle):
    """``calibrate --plan X`` without ``--from-trace`` ran a 90 s measurement instead of the
    fit; ``--schedule VPP`` at pp 1 was costed as no pipeline at all."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(*run_main(capsys, *argv))
    assert needle in line
    assert list(tmp_path.iterdir()) == []


def test_compare_names_a_schedule_at_pp_1_as_a_refused_plan(capsys):
    rc, out, _ = run_main(capsys, "compare", *COST[1:], "--dp", "8", "--schedules", "1F1B,ZBH1")
    assert rc == 0 and "refused" in out and "pp 1 has none" in " ".join(out.split())


def test_an_unknown_torchtitan_section_is_refused(tmp_path, capsys):
    """A misspelled ``[paralelism]`` was costed as no parallelism at all; torchtitan
    itself raises on a field its JobConfig lacks."""
    toml = tmp_path / "job.toml"
    toml.write_text("[paralelism]\ndata_parallel_shard_degree = 8\n[training]\nlocal_batch_size = 1\n"
                    "seq_len = 2048\n[activation_checkpoint]\nmode = \"none\"\n")
    line = one_line_error(*run_main(capsys, "cost", "--torchtitan-config", str(toml), "-m", "llama2-7b",
                                    "--cluster", "dgx-h100", "--layers", "2"))
    assert "[paralelism]: not a section of torchtitan's job config" in line
    toml.write_text("[job]\ncustom_config_module = \"my.config\"\n[mine]\nx = 1\n[parallelism]\n"
                    "data_parallel_shard_degree = 8\n[training]\nlocal_batch_size = 1\nseq_len = 2048\n"
                    "[activation_checkpoint]\nmode = \"none\"\n")
    with pytest.warns(UserWarning, match=r"sections \[mine\] come from \[job\] custom_config_module"):
        rc, _, err = run_main(capsys, "cost", "--torchtitan-config", str(toml), "-m", "llama2-7b",
                              "--cluster", "dgx-h100", "--layers", "2")
    assert rc == 0, err


@pytest.mark.parametrize(("section", "key"), [
    ("zero_optimization", "stage"), ("zero_optimization", "zero_hpz_partition_size"),
    ("tensor_parallel", "autotp_size"),
])
def test_null_in_a_deepspeed_pydantic_field_is_refused(tmp_path, capsys, section, key):
    """``"stage": null`` was read as stage 0; DeepSpeed's pydantic config refuses null for
    these integer fields (runtime/zero/config.py, runtime/tensor_parallel/config.py at
    edaa722)."""
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
           section: {key: None}}
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg))
    line = one_line_error(*run_main(capsys, "cost", "--deepspeed-config", str(p), "-m", "llama2-7b",
                                    "--cluster", "dgx-h100", "--layers", "2"))
    assert f"{section}.{key} is null" in line


def test_a_plan_file_without_version_is_warned_about(tmp_path):
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy

    doc = json.loads(Plan(model="llama2-7b", cluster="dgx-h100", strategy=Strategy(dp=8, global_batch_size=8),
                          num_layers=2).to_json())
    del doc["version"]
    with pytest.warns(UserWarning, match="no 'version' field: read as version 2"):
        Plan.from_json(json.dumps(doc))
    doc["version"] = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Plan.from_json(json.dumps(doc))


def test_a_sequence_past_the_position_table_is_refused_and_past_rotary_positions_warned(capsys):
    """``--seq-len 100000`` beyond ``max_position_embeddings`` was costed without a word:
    a learned table has no row for it (refused), rotary positions extrapolate (warned)."""
    from completion.models.config import ModelConfigWarning
    from completion.models.source import ModelSourceError, resolve_model

    with pytest.raises(ModelSourceError, match="longer than the learned position table of model gpt3-175b"):
        resolve_model("gpt3-175b", 4096)
    resolve_model("gpt3-175b", 2048)
    with pytest.warns(ModelConfigWarning, match="rotary positions were not trained that far"):
        resolve_model("llama2-7b", 100000)
    line = one_line_error(*run_main(capsys, "cost", "-m", "gpt3-175b", "--cluster", "dgx-h100",
                                    "--dp", "8", "--global-batch", "8", "--layers", "2", "--seq-len", "4096"))
    assert "--seq-len 4096" in line and "2048 positions" in line


@pytest.mark.parametrize(("text", "read11"), [
    ("1:30", "90"), ("-1:00", "-60"), ("1:30.5", "90.5"), ("yes", "True"), ("No", "False"), ("on", "True"),
    ("OFF", "False"), ("010", "8"), ("0b101", "5"), ("1_000", "1000"), ("1_0.5", "10.5"),
    ("2024-01-02", "a date"), ("12:30:00", "45000"),
])
def test_yaml_1_1_only_implicit_types_are_refused_with_their_line(text, read11):
    with pytest.raises(yaml.YAMLError) as e:
        strict_yaml.load(f"a: 1\nb: {text}\n")
    msg = str(e.value)
    assert f"{text!r} reads as {read11} in YAML 1.1" in msg and "line 2" in msg


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("-3", -3), ("0", 0), ("0x1F", 31), ("2.5", 2.5), ("1.0e+9", 1e9), ("true", True),
    ("false", False), ("null", None), ("~", None), ("'1:30'", "1:30"), ('"yes"', "yes"), ("name", "name"),
    ("1e9", "1e9"),  # YAML 1.1 text: the cluster spec then says how to write it as a number
])
def test_yaml_forms_both_versions_read_alike_load_as_before(text, value):
    assert strict_yaml.load(f"x: {text}") == {"x": value}


def test_a_cluster_with_sexagesimal_nodes_is_refused(tmp_path):
    """``num_nodes: 1:30`` was read as 90 nodes."""
    text = (CATALOG_DIR / "dgx-h100.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["cluster"]["num_nodes"]["value"] = "@@"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc).replace("'@@'", "1:30"))
    with pytest.raises(clusters.ClusterSpecError, match="'1:30' reads as 90 in YAML 1.1"):
        clusters.load_spec_file(p)


def test_a_framework_profile_is_read_with_the_same_schema(tmp_path):
    from simulator.profiles import ProfileError, load_profile

    p = tmp_path / "mine.yaml"
    p.write_text("extends: fsdp2\nname: mine\nprovenance: {x: on}\n")
    with pytest.raises((ProfileError, ValueError), match="'on' reads as True"):
        load_profile(str(p))


def test_an_fp8_peak_below_bf16_is_refused(tmp_path):
    doc = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
    doc["device"]["peak_flops"]["fp8"]["value"] = 1.0e+14
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(clusters.ClusterSpecError, match=r"fp8 peak \(1e\+14 FLOP/s\) is below the bf16 peak"):
        clusters.load_spec_file(p)


@pytest.mark.slow
def test_max_step_time_on_one_size_decides_the_exit(tmp_path, capsys):
    """``--max-step-time`` without ``--gpus`` is not ignored: the best plan must meet it
    (exit 1 and the miss said when it does not)."""
    rc, out, _ = run_main(capsys, *TUNE, "--output", str(tmp_path / "r"), "--max-step-time", "0.001")
    assert rc == 1 and "misses --max-step-time 0.001 s" in out
