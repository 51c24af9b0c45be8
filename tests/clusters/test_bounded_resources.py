"""Bounded resources (issue 43, item 4): processes bounded by the host's cores, parsers
bounded in nesting depth with a clean error, a cluster table of a million ranks without
checking them 216 times, a stopped rank named by the local launcher."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._cli import one_line_error, run_main

TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--trials", "3"]


@pytest.fixture
def two_cores(monkeypatch):
    from meshplan import resources

    monkeypatch.setattr(resources, "host_cores", lambda: 2)


@pytest.mark.parametrize(("argv", "flag"), [
    (["calibrate", "--quick", "--nproc", "64"], "--nproc 64"),
    (["calibrate", "--nproc", "3"], "--nproc 3"),
    ([*TUNE, "--workers", "256"], "--workers 256"),
    ([*TUNE, "--workers", "3"], "--workers 3"),
])
def test_more_processes_than_cores_are_refused_with_the_reason(tmp_path, monkeypatch, capsys,
                                                               two_cores, argv, flag):
    """``calibrate --quick --nproc 64`` on 2 cores gave no answer in 120 s; ``tune
    --workers 256`` took 110 s for 3 trials."""
    monkeypatch.chdir(tmp_path)
    args = [*argv, "-o", "c.yaml"] if argv[0] == "calibrate" else [*argv, "--output", "run"]
    line = one_line_error(*run_main(capsys, *args))
    assert flag in line and "this host has 2 core(s)" in line and "give at most 2" in line
    assert list(tmp_path.iterdir()) == []


def test_the_default_two_processes_pass_on_one_core(monkeypatch):
    from meshplan import resources

    monkeypatch.setattr(resources, "host_cores", lambda: 1)
    resources.check_processes("--nproc", 2, "ranks", "x")  # the defaults stay usable
    with pytest.raises(resources.ResourceError):
        resources.check_processes("--nproc", 3, "ranks", "x")


DEPTH = 500


def _deep_json() -> str:
    return '{"a": ' * DEPTH + "1" + "}" * DEPTH


@pytest.mark.parametrize("kind", ["deepspeed", "torchtitan-array", "torchtitan-table", "hf", "plan",
                                  "pir-list", "pir-dict"])
def test_deeply_nested_inputs_get_one_clean_error(tmp_path, capsys, kind):
    """500 levels of nesting gave RecursionError tracebacks in the PIR parser, the DeepSpeed
    JSON and the torchtitan TOML readers."""
    from completion.nesting import MAX_NESTING

    if kind == "deepspeed":
        p = tmp_path / "ds.json"
        p.write_text(_deep_json())
        argv = ["cost", "--deepspeed-config", str(p), "-m", "llama2-7b", "--cluster", "dgx-h100"]
    elif kind.startswith("torchtitan"):
        p = tmp_path / "job.toml"
        inner = ("[" * DEPTH + "1" + "]" * DEPTH) if kind.endswith("array") else ("{a=" * DEPTH + "1" + "}" * DEPTH)
        p.write_text(f"[training]\nx = {inner}\n")
        argv = ["cost", "--torchtitan-config", str(p), "-m", "llama2-7b", "--cluster", "dgx-h100"]
    elif kind == "hf":
        p = tmp_path / "config.json"
        p.write_text(_deep_json())
        argv = ["cost", "-m", str(p), "--cluster", "dgx-h100", "--global-batch", "8"]
    elif kind == "plan":
        p = tmp_path / "plan.json"
        p.write_text(_deep_json())
        argv = ["cost", str(p)]
    else:
        src = open("../shared/data/programs/mlp_sgd_no_dist_attrs.pir").read()
        deep = ("[" * DEPTH + "1" + "]" * DEPTH) if kind == "pir-list" else ("{a:" * DEPTH + "1" + "}" * DEPTH)
        p = tmp_path / "deep.pir"
        p.write_text(src.replace("need_clip:[true]", f"need_clip:{deep}", 1))
        argv = ["program", "show", "-m", str(p)]
    line = one_line_error(*run_main(capsys, *argv))
    assert ("nested" in line and (str(DEPTH) in line or str(MAX_NESTING) in line)) or "levels" in line, line


@pytest.mark.parametrize("text", ["a = [[1, 2], [3, 4]]", 'a = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["',
                                  "a = '''[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['''", "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n"])
def test_brackets_in_toml_strings_and_comments_do_not_count(text):
    from completion.nesting import toml_depth

    assert toml_depth(text) <= 2


def test_real_inputs_are_well_inside_the_bound():
    from completion.nesting import MAX_NESTING, json_depth

    plan = json.dumps(json.load(open("benchmarks/plans/pp2_zbvpp.json")))
    assert json_depth(plan) < MAX_NESTING // 4


@settings(max_examples=60, deadline=None)
@given(loads=st.lists(st.integers(1, 8), min_size=2, max_size=12), s=st.sampled_from([1024, 2**20, 2**30]))
def test_costs_over_distinct_node_loads_equal_the_costs_over_every_node(loads, s):
    """The collective costs iterate over the distinct per-node loads (``node_loads``), not
    over every node: the worst node depends only on its load, so the result is the same as
    the old loop over every node, for any uneven group."""
    from clusters import load_cluster
    from clusters.collectives import COLLECTIVES
    from clusters.topology import classify

    c = load_cluster("dgx-h100", len(loads))
    ranks = tuple(8 * n + i for n, k in enumerate(loads) for i in range(k))
    topo = classify(ranks, 8)
    ln = c.links
    per_node = [len(rs) for _, rs in topo.per_node]
    assert topo.node_loads == tuple(sorted(set(per_node)))
    assert ln.group_nic_bandwidth(topo) == min(ln.node_nic_bandwidth(k) for k in per_node)
    n = topo.size
    worst = max((k - 1) * ln.intra_latency + (n - k) * ln.inter_latency
                + max((k - 1) * s / (n * ln.intra_bandwidth),
                      (n - k) * s / (n * ln.node_nic_bandwidth(k) / k)) for k in per_node)
    assert COLLECTIVES["all_to_all"](s, topo, ln)["pairwise"] == pytest.approx(worst, rel=1e-12)
    for kind in ("all_reduce", "all_gather", "broadcast"):  # the table's fast path agrees
        assert c.algorithms_on(kind, s, topo) == c.collective_algorithms(kind, s, ranks)


def test_a_cluster_table_of_a_million_ranks_checks_each_group_once(monkeypatch):
    """``clusters show --nodes 131072`` took 71-150 s: every row re-checked the million
    ranks of its group (216 checks). Each group is now checked once."""
    import clusters.cluster as cc
    from clusters import load_cluster
    from clusters.report import collective_rows

    calls = []
    real = cc.check_ranks
    monkeypatch.setattr(cc, "check_ranks", lambda r, w, n: calls.append(1) or real(r, w, n))
    c = load_cluster("dgx-h100", 4096)
    rows = collective_rows(c)
    assert len(calls) == 5  # 0..g-1 for g = 2, 8, 32768 and send_recv's pairs {0, 7}, {0, 32767}
    assert len(rows) == 3 * 6 * 11


def _rank1_stops(rank: int, nproc: int) -> int:
    import os
    import signal

    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen, as by `kill -STOP` or a debugger
    dist.barrier()
    return rank


@pytest.mark.slow
@pytest.mark.distributed
def test_a_stopped_rank_is_named_by_the_local_launcher():
    """A SIGSTOPped rank under ``validate`` without torchrun was not named after 103 s
    (its peer timed out in the barrier and was named instead)."""
    from executor.launch import RankFailure, launch

    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 failed: stopped by a signal .*SIGSTOP") as e:
        launch(_rank1_stops, 2, timeout=100, collective_timeout=90)
    assert e.value.rank == 1
    assert time.monotonic() - t0 < 60  # well before the peer's collective timeout
