"""Strategy validation and the Plan JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.plan import Plan, PlanError
from meshplan.strategy import Strategy, StrategyError


@settings(deadline=None, max_examples=50)
@given(dp=st.integers(1, 8), tp=st.integers(1, 8), pp=st.integers(1, 8), mbs=st.integers(1, 4),
       k=st.integers(1, 4), rc=st.sampled_from(["none", "selective", "full"]),
       zero=st.integers(0, 3), sched=st.sampled_from(["1F1B", "ZBH1", "ZB-2p", "FThenB"]))
def test_plan_json_round_trip(dp, tp, pp, mbs, k, rc, zero, sched):
    strat = Strategy(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, global_batch_size=dp * mbs * k,
                     recompute=rc, zero=zero, schedule=sched if pp > 1 else "1F1B",  # pp 1: no pipeline
                     sequence_parallel=tp > 1)
    plan = Plan("llama2-7b", "dgx-h100", strat, nodes=4,
                annotations={"lm_head.weight": ["Replicate()", "Shard(1)"]},
                num_layers=None if k % 2 else 4)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.strategy.num_microbatches == k


def test_strategy_errors_name_the_field():
    cases = [({"tp": -1}, "'tp'"), ({"schedule": "Chimera"}, "'schedule'"),
             ({"recompute": "half"}, "recompute"), ({"zero": 4}, "'zero'"),
             ({"dp": 2, "global_batch_size": 3}, "global_batch_size"),
             ({"schedule": "ZBVPP", "vpp": 3}, "'vpp'"),
             ({"pp": 2, "layers_per_stage": [4]}, "'layers_per_stage' has 1 entries"),
             ({"layers_per_stage": [-1]}, "'layers_per_stage' must hold integers in 0.."),
             ({"sequence_parallel": True}, "sequence_parallel"),
             ({"annotation": {"w": "Shard(0)"}}, "annotation"), ({"dtype": "int8"}, "dtype")]
    for kw, needle in cases:
        with pytest.raises(StrategyError, match=needle):
            Strategy(**kw)
    assert Strategy(pp=4, schedule="ZB-1p").registered_schedule() == ("ZB", 4.0)
    assert Strategy(pp=4, schedule="ZB-2p").registered_schedule() == ("ZB", 8.0)


def test_schedule_names_are_case_insensitive_with_aliases():
    assert Strategy(schedule="zbvpp", vpp=2).schedule == "ZBVPP"
    assert Strategy(schedule="ZB-V", vpp=2).schedule == "ZBVPP"
    assert Strategy(schedule="gpipe", pp=2).schedule == "FThenB"  # pp 1 takes 1F1B only
    assert Strategy(schedule="1f1b-i", vpp=2).schedule == "VPP"
    assert Strategy(schedule="zb-2P", pp=2).schedule == "ZB-2p"
    with pytest.raises(StrategyError, match="ZBH1 orders the micro-batches of a pipeline, and pp 1 has none"):
        Strategy(schedule="ZBH1")  # issue 43: the API refuses what --schedule ZBH1 --pp 1 does


def test_earlier_knob_names_are_read_and_a_knob_given_twice_is_refused():
    old = {"dp": 2, "mp": 4, "schedule_mode": "ZBH1", "sharding_stage": 1, "pp": 2,
           "global_batch_size": 8}
    s = Strategy.from_dict(old)
    assert (s.tp, s.schedule, s.zero) == (4, "ZBH1", 1)
    assert set(s.to_dict()) >= {"tp", "schedule", "zero"} and "mp" not in s.to_dict()
    with pytest.raises(StrategyError, match="'tp' is given twice"):
        Strategy.from_dict({"tp": 2, "mp": 2})


def test_a_version_1_plan_file_still_loads():
    text = ('{"version": 1, "model": "llama2-7b", "cluster": "dgx-h100", "strategy": '
            '{"dp": 2, "mp": 2, "schedule_mode": "1F1B", "sharding_stage": 2, '
            '"global_batch_size": 4}}')
    plan = Plan.from_json(text)
    assert (plan.strategy.tp, plan.strategy.zero) == (2, 2)
    assert Plan.from_json(plan.to_json()) == plan and '"version": 2' in plan.to_json()


def test_placements_in_every_spelling_are_one_annotation():
    a = Strategy(tp=2, annotation={"w": ["R", "Shard(dim=1)"]})
    b = Strategy(tp=2, annotation={"w": ["Replicate()", "S(1)"]})
    assert a == b and a.annotation == {"w": ["Replicate()", "Shard(dim=1)"]}
    with pytest.raises(StrategyError, match="'X' is not Shard"):
        Strategy(annotation={"w": ["X"]})


def test_plan_errors():
    with pytest.raises(PlanError, match="missing field 'strategy'"):
        Plan.from_dict({"model": "llama2-7b", "cluster": "dgx-h100"})
    with pytest.raises(PlanError, match="strategy"):
        Plan.from_dict({"model": "m", "cluster": "c", "strategy": {"dp": 0}})
    with pytest.raises(PlanError, match="line 1"):
        Plan.from_json("{not json")


def test_num_layers_overrides_the_configs_layer_count():
    """A 4-layer llama2-7b costs 4 decoder layers: model FLOPs differ from the 32-layer model
    by exactly 28 layers' worth (one layer = (32-layer total - 4-layer total) / 28, and the
    2-layer model sits on the same line)."""
    from meshplan.engine import Engine

    strat = Strategy(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    flops = {n: Engine("llama2-7b", "dgx-a100-80g", strat, seq_len=256,
                       num_layers=n).simulate().model_flops for n in (2, 4, 32)}
    per_layer = (flops[32] - flops[4]) / 28
    assert flops[4] - flops[2] == pytest.approx(2 * per_layer, rel=1e-9)
    with pytest.raises(ValueError, match="num_layers"):
        Plan("llama2-7b", "dgx-h100", strat, num_layers=0)


_PLAN = '{"model": "llama2-7b", "cluster": "dgx-a100-80g", "strategy": {"global_batch_size": 8}}'


@pytest.mark.parametrize("text, match", [
    ("[" * 100000 + "]" * 100000, "nested 100000 levels deep"),
    ('{"a":' * 5000 + "1" + "}" * 5000, "nested 5000 levels deep"),
    ('{"model": "m", "cluster": "c", "strategy": {}, "nodes": ' + "9" * 5000 + "}",
     "Exceeds the limit .4300 digits."),
    (_PLAN[:-1] + ', "seq_len": 1000000000}', "'seq_len' is 1000000000, above the limit of 16777216"),
    (_PLAN[:-1] + ', "nodes": 10000000}', "'nodes' is 10000000, above the limit"),
    (_PLAN.replace('"global_batch_size": 8', '"global_batch_size": 1000000000'),
     "'global_batch_size' is 1000000000, above the limit"),
    (_PLAN.replace('"global_batch_size": 8', '"global_batch_size": 8, "dp": 4096, "tp": 4096'),
     "ranks is above the limit"),
    (_PLAN[:-1] + ', "seq_len": 1e400}', "'seq_len' must be an integer >= 1 or null, got inf"),
])
def test_hostile_plan_json_is_a_plan_error(text, match):
    """Issue 16 items 7 and 8: deep nesting (RecursionError before), over-long integers
    (a bare ValueError), unbounded sizes: one PlanError naming the field or the depth."""
    with pytest.raises(PlanError, match=match):
        Plan.from_json(text)


def test_plan_depth_counts_brackets_outside_strings():
    text = _PLAN[:-1] + ', "annotations": {"x": ["' + "[" * 50 + '"]}}'
    with pytest.raises(PlanError, match="annotation"):  # a bad placement, not a depth error
        Plan.from_json(text)


def test_plan_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PlanError, match=f"{bad}: not UTF-8"):
        Plan.load(bad)
    bad.write_text("{nope")
    with pytest.raises(PlanError, match=f"{bad}: plan JSON line 1"):
        Plan.load(bad)
    with pytest.raises(FileNotFoundError, match="plan file not found"):
        Plan.load(tmp_path / "missing.json")


@pytest.mark.parametrize("argv, match", [
    (["cost", "--model", "missing.json", "--cluster", "dgx-a100-80g", "--global-batch", "8"],
     "model config not found: missing.json"),
    (["cost", "--model", "missing.pir", "--cluster", "dgx-a100-80g", "--global-batch", "8"],
     "program file not found: missing.pir"),
    (["program", "show", "--model", "missing.json"], "model config not found: missing.json"),
    (["complete", "--program", "missing.pir", "--mesh", "d0=2"], "program file not found: missing.pir"),
    (["tune", "--model", "missing.json", "--cluster", "dgx-a100-80g", "--global-batch", "8",
      "--trials", "1", "--storage", "memory", "--no-progress"], "model config not found: missing.json"),
])
def test_missing_model_file_is_one_line(tmp_path, capsys, monkeypatch, argv, match):
    """Issue 16 item 7: a missing model file is one ``error:`` line naming it."""
    from meshplan.cli import main
    from tests._cli import one_line_error

    monkeypatch.chdir(tmp_path)
    assert match in one_line_error(main(argv), *capsys.readouterr())


def test_validate_of_a_plan_whose_model_is_missing_is_one_line(tmp_path, capsys):
    from meshplan.cli import main
    from tests._cli import one_line_error

    plan = tmp_path / "p.json"
    plan.write_text('{"model": "%s", "cluster": "cpu-local", "strategy": {}}' % (tmp_path / "gone.json"))
    line = one_line_error(main(["validate", str(plan), "--nproc", "1"]), *capsys.readouterr())
    assert f"model config not found: {tmp_path / 'gone.json'}" in line


def test_resolve_model_refuses_unbounded_sizes():
    from completion.models.source import ModelSourceError, resolve_model

    with pytest.raises(ModelSourceError, match="seq_len is 1000000000, above the limit"):
        resolve_model("llama2-7b", seq_len=10**9)
    with pytest.raises(ModelSourceError, match="num_layers is 100000, above the limit"):
        resolve_model("llama2-7b", num_layers=10**5)


def test_plan_finds_its_model_file_beside_it_from_any_directory(tmp_path, monkeypatch):
    """A plan naming ``llama_l2.json`` (a file beside it) loads from another working
    directory: the reference resolves against the plan's folder; names stay names."""
    import shutil

    from meshplan.plan import Plan

    root = Path(__file__).resolve().parents[2]
    d = tmp_path / "plans"
    d.mkdir()
    for f in ("dp2.json", "llama_l2.json"):
        shutil.copy(root / "benchmarks" / "plans" / f, d / f)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    plan = Plan.load(d / "dp2.json")
    assert Path(plan.model) == d / "llama_l2.json" and Path(plan.model).is_file()
    assert plan.cluster == Plan.load(root / "benchmarks" / "plans" / "dp2.json").cluster


def test_engine_from_plan_takes_a_plan_json_path(tmp_path):
    """The README calls plan.json 'loadable by Engine.from_plan': a path works as the Plan."""
    from meshplan.engine import Engine

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "plans"
    by_path = Engine.from_plan(root / "dp2.json").cost()
    assert by_path == Engine.from_plan(Plan.load(root / "dp2.json")).cost()
    with pytest.raises(FileNotFoundError):
        Engine.from_plan(str(tmp_path / "none.json"))


def test_vpp_micro_batches_not_a_multiple_of_pp_is_refused_in_the_strategy():
    """Megatron-LM's interleaved schedule runs micro-batches in groups of pp: 6 micro-batches
    on pp = 4 are refused before a step is built, naming the batch fields (the schedule
    builder's own message spoke of ``num_microbatches`` and ``num_stages``); 8 are taken."""
    from completion.strategy import Strategy, StrategyError
    from meshplan.engine import Engine

    s = Strategy(dp=1, pp=4, vpp=2, schedule="VPP", micro_batch_size=2, global_batch_size=12)
    with pytest.raises(StrategyError, match=r"'global_batch_size' \(12\) gives 6 micro-batches.*"
                                            r"multiple of pp = 4"):
        s.check_micro_batches()
    with pytest.raises(StrategyError, match="gives 6 micro-batches"):  # before building anything
        Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=128)
    ok = s.replace(global_batch_size=16)
    ok.check_micro_batches()
    assert ok.num_microbatches == 8


@pytest.mark.parametrize("kw, what", [
    ({"fp8": ["te-delayed"]}, "'fp8' must be one of"), ({"fp8": {}}, "'fp8' must be one of"),
    ({"zero": 1.0}, "'zero' (ZeRO stage) must be 0, 1, 2 or 3, got 1.0"),
    ({"pp": 2, "layers_per_stage": {1: 1, 2: 2}}, "'layers_per_stage' must be a list of integers"),
    ({"recompute": ["full"]}, "'recompute' must be one of"),
    ({"attention": ["flash"]}, "'attention' must be one of"),
])
def test_wrong_types_are_refused_naming_the_field(kw, what):
    """Found by a bad-input hunt: a list or dict fp8 raised a bare TypeError (unhashable),
    zero=1.0 passed and reached the DeepSpeed export as "stage": 1.0, a dict's keys were
    taken for a layer split."""
    with pytest.raises(StrategyError) as e:
        Strategy(**kw)
    assert what in str(e.value)


def test_plan_version_and_annotations_types():
    from meshplan.plan import Plan, PlanError

    base = {"model": "llama2-7b", "cluster": "dgx-h100", "strategy": {"global_batch_size": 4}}
    for version in (True, 1.0):
        with pytest.raises(PlanError, match="plan field 'version' is"):
            Plan.from_dict({**base, "version": version})
    for ann in (False, 0):
        with pytest.raises(PlanError, match="'annotations' must be a mapping"):
            Plan.from_dict({**base, "annotations": ann})
    assert Plan.from_dict({**base, "annotations": None}).annotations == {}


def test_engine_options_of_the_wrong_type_are_engine_errors():
    from meshplan.engine import Engine, EngineError

    for kw, what in (({"overlap": "0.5"}, "overlap must be a number"), ({"overlap": None}, "overlap must be"),
                     ({"gemm_efficiency": "0.5"}, "gemm_efficiency must be a number")):
        with pytest.raises(EngineError, match=what):
            Engine("llama2-7b", "dgx-a100-80g", Strategy(), **kw)
    with pytest.raises(EngineError, match="strategy must be a meshplan.Strategy .* got dict"):
        Engine("llama2-7b", "dgx-a100-80g", {"dp": 2})


def test_a_saved_plan_finds_its_config_and_cluster_from_any_directory(tmp_path, monkeypatch):
    """`tune --model my.json --cluster my.yaml --output run/` writes run/plan.json: the
    files were named from the working directory, so the plan names them from its own
    folder (../my.json) and loads from anywhere, e.g. from inside run/ for `export`."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "cfg").mkdir()
    cfg = tmp_path / "cfg" / "tiny.json"
    cfg.write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, '
                   '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, '
                   '"max_position_embeddings": 32}')
    shutil.copy(root / "clusters" / "catalog" / "dgx-h100.yaml", tmp_path / "cfg" / "mine.yaml")
    monkeypatch.chdir(tmp_path)
    s = Strategy(dp=2, micro_batch_size=1, global_batch_size=2)
    Path("run").mkdir()
    Plan("cfg/tiny.json", "cfg/mine.yaml", s).save(Path("run") / "plan.json")
    raw = (tmp_path / "run" / "plan.json").read_text()
    assert '"model": "../cfg/tiny.json"' in raw and '"cluster": "../cfg/mine.yaml"' in raw
    for cwd in (tmp_path / "run", tmp_path / "cfg", Path("/")):
        monkeypatch.chdir(cwd)
        plan = Plan.load(tmp_path / "run" / "plan.json")
        assert Path(plan.model).resolve() == cfg.resolve()
        assert Path(plan.cluster).resolve() == (tmp_path / "cfg" / "mine.yaml").resolve()
    # a catalog name, and an absolute path, are written as given
    Plan("llama2-7b", str(tmp_path / "cfg" / "mine.yaml"), s).save(tmp_path / "abs.json")
    raw = (tmp_path / "abs.json").read_text()
    assert '"model": "llama2-7b"' in raw and f'"cluster": "{tmp_path / "cfg" / "mine.yaml"}"' in raw
    # a Hugging Face model folder (holding config.json) is a path too, marked by a final /;
    # a folder named like a built-in model stays the built-in name (the catalog wins)
    monkeypatch.chdir(tmp_path)
    shutil.copy(cfg, tmp_path / "cfg" / "config.json")
    Plan("cfg", "dgx-h100", s).save(Path("run") / "folder.json")
    assert '"model": "../cfg/"' in (tmp_path / "run" / "folder.json").read_text()
    monkeypatch.chdir("/")
    from completion import get_model_config

    plan = Plan.load(tmp_path / "run" / "folder.json")
    assert Path(plan.model).resolve() == (tmp_path / "cfg").resolve()
    assert get_model_config(plan.model).num_layers == 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama2-7b").mkdir()
    shutil.copy(cfg, tmp_path / "llama2-7b" / "config.json")
    Plan("llama2-7b", "dgx-h100", s).save(Path("run") / "name.json")
    assert '"model": "llama2-7b"' in (tmp_path / "run" / "name.json").read_text()


def test_links_keep_their_names_and_a_linked_plan_finds_its_files(tmp_path, monkeypatch):
    """The reviewer's two cases: a Hugging Face snapshot's config.json is a link to a blob
    with no .json name (the plan must name the link, not the blob), and a plan opened
    through a link to it (best.json -> runs/x/plan.json) finds the files named from its
    real folder."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snap").mkdir()
    (tmp_path / "blobs" / "abc123").write_text(
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
        '"intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 32}')
    (tmp_path / "snap" / "config.json").symlink_to("../blobs/abc123")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    s = Strategy(dp=2, micro_batch_size=1, global_batch_size=2)
    Plan("snap/config.json", "dgx-h100", s).save(Path("runs") / "x" / "plan.json")
    assert '"model": "../../snap/config.json"' in (tmp_path / "runs" / "x" / "plan.json").read_text()
    (tmp_path / "best.json").symlink_to("runs/x/plan.json")
    for plan_file in (tmp_path / "runs" / "x" / "plan.json", tmp_path / "best.json"):
        model = Plan.load(plan_file).model
        assert Path(model).resolve() == (tmp_path / "blobs" / "abc123").resolve(), model


def test_a_key_given_twice_is_refused(tmp_path):
    """JSON parsers keep the last of two equal keys: a hand-edited plan with "dp": 1 and
    "dp": 2 exported dp 2 without a word (a bad-input hunt)."""
    text = '{"model": "llama2-7b", "cluster": "dgx-h100", "strategy": {"dp": 1, "dp": 2}}'
    with pytest.raises(PlanError, match="key 'dp' appears twice in one object"):
        Plan.from_json(text)
