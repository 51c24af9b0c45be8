"""MoE parallel folding (issue 42): the expert layers on the same ranks with their own expert
tensor, expert and expert-data parallel degrees (tp x cp x dp = etp x ep x edp,
``completion.expert_layout``), so ep may exceed dp (etp 1) and combine with cp. The rank
groups are checked against an independent re-derivation of Megatron-Core's
``RankGenerator`` (NVIDIA/Megatron-LM d98e8a64 ``megatron/core/parallel_state.py``: the
dense generator ``tp-cp-ep-dp-pp`` with ep = 1, the expert one with cp = 1); the program's
collectives by hand; the gloo runs in ``tests/meshplan/test_moe_folding_verify.py``."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.expert_layout import expert_layout, layout_problem
from completion.models import ModelConfigWarning, config_from_hf_dict
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from completion.strategy import Strategy, StrategyError
from simulator.expert_parallel import ep_group, expert_dp_degree, expert_dp_group
from tests._cli import run_main
from tests.completion.test_moe_program import TINY

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def megatron_groups(sizes: dict[str, int], order: str, token: str) -> list[list[int]]:
    """Rank groups of ``token`` (e.g. "ep") for parallel sizes laid out in ``order``,
    innermost first, as Megatron-Core's ``generate_masked_orthogonal_rank_groups`` yields
    them: the ranks that differ only in the masked coordinates (re-derived here: a rank's
    coordinates are its mixed-radix digits in ``order``)."""
    names = order.split("-")
    dims = [sizes[n] for n in names]
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(max(1, int(__import__("math").prod(dims)))):
        coord, r = [], rank
        for d in dims:
            coord.append(r % d)
            r //= d
        key = tuple(c for n, c in zip(names, coord, strict=True) if n != token)
        groups.setdefault(key, []).append(rank)
    return sorted(groups.values())


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8, 16]), whole=st.booleans())
def test_expert_groups_are_megatrons(tp, cp, dp, ep, whole):
    """Property: for every (tp, cp, dp, ep, etp) that folds, edp = tp cp dp / (ep etp), and
    the first ep group and expert-data-parallel group of stage 0 (``simulator
    .expert_parallel``, on the folded dp = dp x cp) are those of Megatron-Core's expert
    RankGenerator(tp=etp, ep, dp=edp, cp=1), order tp-ep-dp."""
    etp = 1 if whole else tp
    why = layout_problem(dp, cp, tp, ep, etp)
    if why is not None:
        with pytest.raises(StrategyError):
            Strategy(dp=dp, cp=cp, tp=tp, ep=ep, etp=etp, global_batch_size=dp)
        return
    lay = expert_layout(dp, cp, tp, ep, etp)
    assert lay.ep * lay.etp * lay.edp == tp * cp * dp
    cfg = SimpleNamespace(dp=dp * cp, tp=tp, ep=ep, etp=etp)
    sizes = {"tp": etp, "ep": ep, "dp": lay.edp}
    assert expert_dp_degree(cfg) == lay.edp
    assert ep_group(cfg, 0) == megatron_groups(sizes, "tp-ep-dp", "ep")[0]
    assert expert_dp_group(cfg, 0) == megatron_groups(sizes, "tp-ep-dp", "dp")[0]
    # the dense layers' data-parallel group (cp folded into dp) is Megatron's tp-cp-dp dp x cp
    dense = megatron_groups({"tp": tp, "cp": cp, "dp": dp}, "tp-cp-dp", "tp")
    assert [g[0] // tp for g in dense] == list(range(dp * cp))


def test_the_layouts_of_the_issue_by_hand():
    """Qwen3-235B-A22B's ep 32 with dp 16 and tp 2: only etp 1 folds (32 x 2 does not divide
    32 ranks); edp 1, an ep group spans 16 data-parallel ranks and both tensor ranks. ep 8
    with dp 4, tp 2: etp 1, edp 1. ep 8 beside cp 2, dp 4, tp 1: edp 1."""
    big = expert_layout(16, 1, 2, 32, 1)
    assert (big.edp, big.group_dp, big.group_tp) == (1, 16, 2)
    assert "'ep' = 32 must divide dp = 16" in layout_problem(16, 1, 2, 32, None)
    assert expert_layout(4, 1, 2, 8, 1).edp == 1
    assert expert_layout(4, 2, 1, 8, None).edp == 1
    assert "modelled are etp = tp" in layout_problem(2, 1, 4, 4, 2)
    assert "must be a multiple of tp = 4" in layout_problem(8, 1, 4, 2, 1)


def _tiny_source(layers: int = 1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelConfigWarning)
        return resolve_model(config_from_hf_dict({**TINY, "router_aux_loss_coef": 0.0}), seq_len=32,
                             num_layers=layers)


def test_folded_program_splits_whole_experts_over_dp_and_tp():
    """dp 2, tp 2, ep 4, etp 1 on TINY (4 experts of 32, h 64, top-2, b 2 x s 32): each rank
    holds one whole expert, [2, 2, 64, 32] split (dp, tp). Forward: the expert-major tokens
    [4, b C = 32, 64] (C = 32 * 2 / 4 = 16 slots per sequence), reshaped to [2, 2, 32, 64],
    are sliced over tp (each tp rank keeps its expert column: a local slice) and sent over the
    dp all_to_all: a rank's block [2, 1, 16, 64] fp32, 8,192 bytes; the outputs come back by
    the same all_to_all (8,192 bytes), then the tp ranks gather each other's experts' outputs
    (the combine reads every expert). The shared expert's row-parallel down_proj output is
    all-reduced over tp as a dense MLP's."""
    prog = build_plan_program(_tiny_source(), Strategy(dp=2, tp=2, ep=4, etp=1, dtype="float32",
                                                        micro_batch_size=1, global_batch_size=2)).program
    w = next(v for v in prog.parameters() if v.name == "decoder.layers.0.mlp.experts.gate_proj.weight")
    assert w.shape == (2, 2, 64, 32) and w.dist_attr.dims_mapping == (0, 1, -1, -1)
    fwd = [(op.type, op.attrs["nbytes"], op.attrs["groups"]) for op in prog.ops
           if op.role.name == "FORWARD" and op.struct_name.startswith("decoder.layers.0.mlp.experts")
           and op.type in ("all_to_all", "all_gather", "local_slice")]
    assert [t for t, _, _ in fwd] == ["local_slice", "all_to_all", "all_to_all", "all_gather"]
    a2a = [(n, g) for t, n, g in fwd if t == "all_to_all"]
    assert a2a == [(8192, [[0, 2], [1, 3]])] * 2
    assert fwd[-1][2] == [[0, 1], [2, 3]]
    synced = {op.operands[0].name for op in prog.ops if op.role.name == "OPTIMIZE" and op.type == "all_reduce"
              and op.operands[0] is not None and op.operands[0].name}
    assert not any(".experts." in (n or "") for n in synced)  # edp 1: no expert gradient sync


def test_cost_accepts_ep_32_with_dp_16_and_tp_2_and_ep_with_cp(capsys):
    """The issue's layouts through ``cost`` (Qwen3-235B-A22B on 32 DGX-H100: dp 16, tp 2,
    pp 8, ep 32, etp 1; ep 8 beside cp 2); the JSON layout states etp."""
    base = ["cost", "-m", str(CONFIGS / "qwen3-235b-a22b.json"), "--cluster", "dgx-h100", "--nodes", "32",
            "--pp", "8", "--layers-per-stage", "11,12,12,12,12,12,12,11", "--sequence-parallel",
            "--micro-batch-size", "1", "--global-batch-size", "512", "--seq-len", "4096", "--recompute", "full",
            "--zero", "1", "--json"]
    rc, out, err = run_main(capsys, *base, "--dp", "16", "--tp", "2", "--ep", "32", "--etp", "1")
    assert rc == 0, err
    res = json.loads(out)
    assert res["layout"]["ep"] == 32 and res["layout"]["etp"] == 1 and res["step_time_ms"] > 0
    rc, out, err = run_main(capsys, *base, "--dp", "4", "--cp", "2", "--tp", "4", "--ep", "8")
    assert rc == 0, err
    assert json.loads(out)["layout"]["ep"] == 8
    rc, out, err = run_main(capsys, *base, "--dp", "16", "--tp", "2", "--ep", "32")
    assert rc == 2 and "--ep = 32 must divide --dp = 16" in err and "etp = 1" in err


def test_expert_data_parallel_gradient_sync_of_a_folded_plan():
    """dp 4, tp 2, ep 4, etp 1 (edp 2): a rank's expert gradients are reduced over its
    expert-data-parallel pair; the step model's ``expert_sync`` is that all_reduce of the
    rank's expert elements (2 experts of 3 * 64 * 32 per MoE layer), on ranks [0, 4]."""
    from meshplan import Engine

    s = Strategy(dp=4, tp=2, ep=4, etp=1, micro_batch_size=1, global_batch_size=4)
    src = _tiny_source(2)
    eng = Engine(src.config, "dgx-h100", s, seq_len=32)
    model = eng.step_model()
    cfg = model.cfg
    assert (expert_dp_degree(cfg), expert_dp_group(cfg, 0)) == (2, [0, 4])
    expert = model.rank_params([0]) - model.rank_params([0], synced=True)
    assert expert == 2 * 1 * 3 * 64 * 32  # 2 layers x 1 local expert x gate/up/down
    assert model.run().step_time > 0


def test_megatron_export_writes_the_expert_tensor_parallel_size(capsys):
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(CONFIGS / "qwen3-30b-a3b.json"),
                            "--cluster", "dgx-h100", "--dp", "4", "--tp", "2", "--ep", "8", "--etp", "1",
                            "--global-batch", "16", "--seq-len", "4096", "--layers", "2")
    assert rc == 0, err
    lines = [ln.rstrip(" \\") for ln in out.splitlines()]
    assert "--expert-model-parallel-size 8" in lines and "--expert-tensor-parallel-size 1" in lines
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(CONFIGS / "qwen3-30b-a3b.json"),
                            "--cluster", "dgx-h100", "--dp", "8", "--ep", "8", "--global-batch", "16",
                            "--seq-len", "4096", "--layers", "2")
    assert rc == 0 and "--expert-tensor-parallel-size" not in out  # etp = tp: Megatron's default


@pytest.mark.parametrize("dp,cp,tp,ep,etp", [
    (d, c, t, e, x) for d, c, t, e, x in itertools.product((2, 4), (1, 2), (1, 2), (2, 4, 8), (None, 1))
    if layout_problem(d, c, t, e, x) is None and not (x == 1 and t == 1)])
def test_every_folded_layout_completes(dp, cp, tp, ep, etp):
    """Every folding of TINY's 4 (or 8) experts that the rule admits builds, completes and
    partitions (the representative program the cost model costs), rank 0 holding E / ep
    whole experts (etp 1) or E / ep experts split over tp (etp = tp)."""
    src = _tiny_source()
    if (src.config.num_experts % ep):
        src = resolve_model(src.config.replace(num_experts=8), seq_len=32, num_layers=1)
    s = Strategy(dp=dp, cp=cp, tp=tp, ep=ep, etp=etp, micro_batch_size=1, global_batch_size=dp)
    pp = build_plan_program(src, s, representative=True)
    w = next(v for v in pp.program.parameters() if v.name == "decoder.layers.0.mlp.experts.gate_proj.weight")
    local = w.dist_attr.local_shape(w.shape, 0)
    e, t = src.config.num_experts, (etp or tp)
    assert __import__("math").prod(local) == e // ep * 64 * 32 // t
