"""FSDP2 under torch's pipelining holds a stage's weights gathered and its gradients
unsharded between micro-batches, then reduces once after the stage's last backward
(torch 2.13.0 ``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync`` and
``perform_reduce_grad``; profile fact ``pipeline.fsdp_accumulate_unsharded`` of fsdp2).

Before, the fsdp2 profile costed a pp > 1 ZeRO-3 plan as FSDP without pipelining: 16 P / N
of states plus a few gathered blocks, and a reduce_scatter per block per micro-batch. On
Llama 2 7B, pp 2, dp 4 that understated a rank's model states by 13.7 GiB (14.9 ->
28.6 GiB: the unsharded fp32 gradients and bf16 weights of 3.4 B parameters), so ``tune``
could pick plans that do not fit. Here: the state model by hand, the engine's lines and tail by hand,
and the bytes torch itself holds on four gloo ranks (pp 2 x dp 2)."""

from __future__ import annotations

import pytest

from meshplan import Engine, Strategy
from simulator.dp_groups import reduce_time
from simulator.model_states import StateInputs, fsdp_states

GiB = 2**30


@pytest.mark.parametrize("zero, freed, buffers", [
    (2, 500, 200),  # ZeRO-2: the 2P weights are its params line; buffers: the fresh 2 x 100
    (3, None, 620),  # ZeRO-3, a lower bound: gathered root + 2 blocks, 2 x (10 + 200), + 200
    (3, 500, 1700),  # right after a backward: 2P - 500 = 1500 > 420, + 200
    (3, 1800, 620),  # a micro-batch's activations outweigh the weights: the forward's peak
])
def test_state_model_by_hand(zero, freed, buffers):
    """P = 1000 over N = 4, bf16 weights, fp32 reduce, a 100-element block, root 10,
    prefetch 1: 4P unsharded gradients on both stages; ZeRO-2 2P weights + 12P/N master and
    Adam; ZeRO-3 4P/N masters, 8P/N Adam and the larger of the gathered blocks and 2P less
    the activations a backward frees."""
    x = StateInputs(params=1000, dp=4, zero=zero, reduce_bytes=4, largest_block=100,
                    root_params=10, prefetch=1, accumulate_unsharded=True, backward_freed=freed)
    s = fsdp_states(x)
    lines = (2000, 4000, 3000) if zero == 2 else (1000, 4000, 2000)
    assert (s.params, s.grads, s.optimizer, s.buffers) == (*lines, buffers)
    # without the pipeline's accumulation: FSDP's 16P/N + root and 2 blocks gathered + head
    # gradient (largest_param 0 here) + one block's gradient and its fp32 copy
    plain = fsdp_states(StateInputs(params=1000, dp=4, zero=3, reduce_bytes=4, largest_block=100,
                                    root_params=10, prefetch=1))
    assert plain.total == 16 * 250 + 2 * (10 + 2 * 100) + (2 + 4) * 100 == 5020


def _engine(pp: int, zero: int = 3, framework: str = "fsdp2") -> Engine:
    s = Strategy(dp=4, pp=pp, micro_batch_size=1, global_batch_size=32, zero=zero,
                 framework=framework, schedule="1F1B")
    return Engine("llama2-7b", "dgx-h100", s, nodes=1, seq_len=4096)


def test_engine_lines_and_the_one_reduce_by_hand():
    """Llama 2 7B, fsdp2, pp 2 x dp 4, ZeRO-3: each rank holds 4 bytes of unsharded
    gradient per stage parameter, its bf16 weights gathered, and pays one fp32
    reduce_scatter of them over its 4 dp ranks after its last backward, exposed; no block
    reduces per micro-batch."""
    e = _engine(pp=2)
    sm = e.step_model()
    res = sm.run()
    for r in range(2):
        vstages = list(res.schedule.vstage[r])
        params = sm.rank_params(vstages)
        mem = res.memory_per_stage[r]
        assert mem["grads"] == 4 * params
        assert mem["params"] == 4 * -(-params // 4)  # the sharded fp32 masters
        assert mem["optimizer"] == 8 * -(-params // 4)
        synced = sm.rank_params(vstages, synced=True)
        one = reduce_time(e.cluster, sm.cfg, r, 4 * synced)
        assert one == pytest.approx(e.cluster.collective_time(
            "reduce_scatter", 4 * synced, [r * 4 + d for d in range(4)]), rel=1e-12)
        assert res.rank_tails[r]["grad_reduce"] == pytest.approx(one, rel=1e-12)
    for r in range(2):  # ZeRO-3: the forward resharded; 2P less one micro-batch's activations
        freed = min(mb for (rk, _), (mb, _) in res.activation_per_chunk.items() if rk == r)
        params = sm.rank_params(list(res.schedule.vstage[r]))
        block = 202_383_360  # a Llama 2 7B layer: 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096
        root = 32000 * 4096 + (4096 if r == 1 else 0)  # the embedding; the final norm and head
        gathered = 2 * (root + 2 * block)
        assert res.memory_per_stage[r]["param_buffers"] == max(gathered, 2 * params - int(freed)) + 2 * block
    for vs, parts in enumerate(res.stage_parts):
        gathers = sum(sm.timer.zero3_gather_time(b) for b in sm.timer.blocks(vs))
        assert parts["fsdp"] == pytest.approx(gathers, rel=1e-12)  # once per micro-batch, no reduce
    # the states grew by the unsharded fp32 gradients: 12.55 GiB on a 3.4 B stage
    assert res.memory_breakdown["grads"] / GiB == pytest.approx(4 * sm.rank_params([0]) / GiB)
    assert res.memory_breakdown["grads"] / GiB > 12.5


def test_without_pipelining_or_without_the_fact_nothing_changes():
    """pp = 1 under fsdp2, and pp = 2 under a profile without the fact (deepspeed keeps no
    unsharded accumulation: its own engine), keep the sharded gradients and no tail reduce."""
    res = _engine(pp=1).simulate()
    p = _engine(pp=1).step_model().rank_params([0])
    assert res.memory_breakdown["grads"] == 4 * -(-p // 4)
    assert res.rank_tails[0]["grad_reduce"] == 0.0
    res = _engine(pp=2, zero=1, framework="deepspeed").simulate()
    assert all(t["grad_reduce"] == 0.0 for t in res.rank_tails)


H = 32


def _pipeline_rank(rank: int, nproc: int):
    """One of 4 gloo ranks (pp 2 x dp 2) running torch's Schedule1F1B over 4 micro-batches
    on a 2-block FSDP2 stage (bf16 weights, fp32 reduce, blocks resharded after forward:
    ZeRO-3); after every forward and every backward, the bytes of unsharded accumulated
    gradients and of gathered weights it holds."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp = mesh["pp"].get_local_rank()
    torch.manual_seed(pp)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(H, 2 * H, bias=False), nn.Linear(2 * H, H, bias=False))
                            for _ in range(2)])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    params = sum(p.numel() for p in model.parameters())
    stage = PipelineStage(model, pp, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    held: dict[str, list[tuple[int, int]]] = {"F": [], "B": []}

    def record(phase: str, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            acc = gathered = 0
            for block in model:
                for fp in fully_shard.state(block)._fsdp_param_group.fsdp_params:
                    g = fp.unsharded_accumulated_grad
                    acc += 0 if g is None else g.numel() * g.element_size()
                    if fp.sharded_state.name == "UNSHARDED":
                        gathered += fp._unsharded_param.numel() * fp._unsharded_param.element_size()
            held[phase].append((acc, gathered))
            return out
        return run

    stage.forward_maybe_with_nosync = record("F", stage.forward_maybe_with_nosync)
    stage.backward_maybe_with_nosync = record("B", stage.backward_maybe_with_nosync)
    sched = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda y, t: (y.float() - t).pow(2).mean())
    x, target = torch.randn(8, H), torch.randn(8, H)
    if pp == 0:
        sched.step(x)
    else:
        sched.step(target=target, losses=[])
    sharded_rows = next(iter(model.parameters())).grad.to_local().shape[0]
    return params, held, sharded_rows


def test_torch_pipelining_holds_what_the_state_model_counts():
    """torch's own pipelining on 4 gloo ranks, a stage of P = 8192 parameters: after each
    of the 4 backwards it holds 4P bytes of fp32 unsharded gradients (the grads line of
    ``fsdp_states(accumulate_unsharded=True)``) and its 2P bytes of bf16 weights gathered
    (what the buffers line counts right after a backward); after each forward past the
    first backward the gradients are still held but the ZeRO-3 forward has resharded every
    block (0 gathered: at the activation peak the buffers line counts FSDP's gathered
    blocks, never more); one reduce_scatter at the end leaves the gradients sharded over
    dp 2."""
    from executor.launch import launch

    results = launch(_pipeline_rank, 4, timeout=240)
    for params, held, sharded_rows in results:
        assert params == 2 * 2 * H * 2 * H == 8192
        model = fsdp_states(StateInputs(params=params, dp=2, zero=3, reduce_bytes=4,
                                        largest_block=params // 2, accumulate_unsharded=True,
                                        backward_freed=0))
        assert len(held["B"]) == 4 and len(held["F"]) == 4
        for acc, gathered in held["B"]:
            assert acc == model.grads == 4 * params
            assert gathered == model.buffers - 2 * (params // 2) == 2 * params
        seen_backward = [f for f in held["F"] if f[0] > 0]  # forwards after the first backward
        assert seen_backward and all(acc == 4 * params and gathered == 0 for acc, gathered in seen_backward)
        assert sharded_rows == 2 * H // 2
