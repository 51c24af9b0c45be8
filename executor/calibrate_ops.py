"""Op timings of the executor's own interpreter, for calibration.

What a plan's step costs on this machine is what the executor pays per op: its
interpreter loop (value lookup, liveness, memory tracking), the torch dispatch of each
kernel, and the kernel's work at the shapes the plan uses. So calibration runs the
executor itself on transformer layers (a 2-layer LLaMA-style program, forward, backward
and SGD, 2 micro-batches per step: the working set of a real step, so caches are as
contended as in a plan's run) at a few sizes, times every executed item, and classifies it the way the
simulator's op cost model does (``simulator.op_cost``; the conventions are repeated here
because the executor does not import the simulator). The kind is the op's declared kernel
(``OpTraits.kernel`` in ``completion.ops``, the trait the cost model reads too):

- ``gemm``: ``"gemm"`` kernels, ``matmul`` and each computed part of ``matmul_grad`` (dX
  or dW): 2 * batch * m * n * k FLOPs per part (Megatron-LM 2021 appendix);
- ``attention``: ``"attention"`` kernels, ``flash_attention``: executed FLOPs 4 b h s_q s_k
  d times the causal fraction (s_k + 1) / (2 s_k), its grad 2.5 times that
  (FlashAttention-2 sec. 3.1);
- ``memory``: every other kernel; bytes = its operands read + its (wanted) results
  written, except the gathers, counted as the cost model counts them: ``embedding`` reads
  the ids and the selected rows and writes them (ids + 2 x out), ``embedding_grad``
  writes the table gradient and reads the ids and dout three times (zero, read,
  scatter-add: table grad + ids + 3 x dout);
- ``view``: ops that launch no kernel (``kernel`` None; the cost model gives them none):
  reshape / squeeze / unsqueeze and their grads, shadow_output;
- ``action``: per F/B/W unit call (a pipeline action pass), its wall time minus the summed
  time of its ops in the same call -- the interpreter's per-action host work outside any
  op (unit loop, micro-batch environment lookups); median over further steps.

Each sample is ``(kind, op type, flops, bytes, seconds, phase)`` with seconds the median
over the timed steps and phase the unit it ran in (F, B, W, or O for the optimizer step). Run on every rank at once (``calibrate`` launches it on ``nproc`` ranks), so
the cores are as loaded as during a plan's run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from completion.ops.registry import op_traits

# (hidden, heads, ffn, seq, batch): a small and a mid-size layer (quick: the small one
# and a smaller one); every LLaMA-style op at the sizes 2-rank CPU plans use
FULL_SIZES = ((128, 2, 352, 64, 2), (256, 4, 688, 128, 2), (512, 8, 1376, 128, 2))
QUICK_SIZES = ((128, 2, 352, 64, 1), (256, 4, 688, 64, 2))
LAYERS, MICROBATCHES = 2, 2


@dataclass(frozen=True)
class OpSample:
    """One executed op (or op part) of the calibration program."""

    kind: str
    op_type: str
    flops: float
    bytes: float
    seconds: float
    phase: str = ""


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def _gemm_flops(op: Any, ins: list, want: Any) -> float:
    x, y = ins[0], ins[1]
    k = x.shape[-2] if op.attrs.get("transpose_x") and x.ndim > 1 else x.shape[-1]
    ys = list(y.shape) if y.ndim > 1 else [y.shape[0], 1]
    n = ys[-2] if op.attrs.get("transpose_y") else ys[-1]
    xs = list(x.shape) if x.ndim > 1 else [1, x.shape[0]]
    m = xs[-1] if op.attrs.get("transpose_x") else xs[-2]
    batch = 1
    for d in torch.broadcast_shapes(tuple(xs[:-2]), tuple(ys[:-2])):
        batch *= d
    parts = 1 if op.type == "matmul" else len(want) if want is not None else 2
    return 2.0 * batch * m * n * k * parts


def _attention_flops(op: Any, ins: list) -> float:
    q, k = ins[0], ins[1]
    b, sq, h, d = q.shape
    sk = k.shape[1]
    frac = (sk + 1) / (2 * sk) if op.attrs.get("causal", True) and sq == sk else 1.0
    fwd = 4.0 * b * h * sq * sk * d * frac
    return fwd * (2.5 if op.type.endswith("_grad") else 1.0)


def classify(op: Any, ins: list, out_bytes: list[int], want: Any) -> tuple[str, float, float]:
    """(kind, flops, bytes) of one executed item (module docstring); ``out_bytes`` per
    result of the op (parts not in ``want`` are not counted)."""
    nbytes = float(sum(_nbytes(t) for t in ins) + sum(
        b for i, b in enumerate(out_bytes) if want is None or i in want))
    kernel = op_traits(op.type).kernel
    if kernel is None:
        return "view", 0.0, nbytes
    if kernel == "gemm":
        return "gemm", _gemm_flops(op, ins, want), nbytes
    if kernel == "attention":
        return "attention", _attention_flops(op, ins), nbytes
    if op.type in GATHER_BYTES:
        return "memory", 0.0, GATHER_BYTES[op.type](ins, out_bytes, want)
    return "memory", 0.0, nbytes


def _embedding_bytes(ins: list, out_bytes: list[int], want: Any) -> float:
    return float(_nbytes(ins[0]) + 2 * out_bytes[0])


def _embedding_grad_bytes(ins: list, out_bytes: list[int], want: Any) -> float:
    table = sum(b for i, b in enumerate(out_bytes) if want is None or i in want)
    return float(table + _nbytes(ins[0]) + 3 * _nbytes(ins[-1]))


# op type -> bytes(ins, out_bytes, want) where the cost model does not count operands + results
GATHER_BYTES = {"embedding": _embedding_bytes, "embedding_grad": _embedding_grad_bytes}


def out_bytes(it: Any) -> list[int]:
    """Bytes of each result of rank plan item ``it`` (its rank op's local result shapes x
    the result's dtype size; 0 for an absent result)."""
    from executor.kernels import torch_dtype

    out = []
    for v, shape in zip(it.op.results, it.ro.result_shapes, strict=False):
        n = 0
        if v is not None and shape is not None:
            n = torch.Size(shape).numel() * torch.empty((), dtype=torch_dtype(v.dtype)).element_size()
        out.append(int(n))
    return out


def _program(hidden: int, heads: int, ffn: int, seq: int, batch: int):
    from completion import append_backward, apply_optimizer, build_model
    from completion.models.hf_config import config_from_hf_dict

    cfg = config_from_hf_dict({
        "model_type": "llama", "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": heads, "intermediate_size": ffn, "vocab_size": 1000,
        "max_position_embeddings": seq, "num_hidden_layers": LAYERS}, "calibration")
    prog = build_model(cfg, batch_size=batch, seq_len=seq, dtype="float32", num_layers=LAYERS)
    append_backward(prog)
    apply_optimizer(prog, "sgd", learning_rate=0.01)
    return prog


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize(device)


def trace_layer(size: tuple[int, int, int, int, int], steps: int,
                device: str = "cpu") -> list[OpSample]:
    """Run the ``LAYERS``-layer program of ``size`` = (hidden, heads, ffn, seq, batch) in this
    process on ``device`` for ``steps`` steps (after one warm-up step) and return one
    sample per executed item (median seconds over the steps' first micro-batch -- the
    later ones also add their weight gradients into the accumulators, which the cost
    model counts apart; CUDA is synchronised around each item)."""
    from executor.actions import single_stage_order
    from executor.collectives import Groups
    from executor.rank_exec import RankExecutor
    from executor.rank_plan import build_rank_plan

    batch = size[4]
    ex = RankExecutor(build_rank_plan(_program(*size), 0), Groups([]), batch, MICROBATCHES,
                      device=device)
    times: dict[int, list[float]] = {}
    info: dict[int, tuple[str, str, float, float]] = {}
    phases: dict[int, str] = {}
    run = ex.exec_item

    def timed(it, mb, env, left, key):
        ins = [None if v is None else ex.value(v, env, mb) for v in it.op.operands]
        _sync(device)
        t0 = time.perf_counter()
        run(it, mb, env, left, key)
        _sync(device)
        dt = time.perf_counter() - t0
        if mb == 0:  # later micro-batches also accumulate gradients (modelled apart)
            times.setdefault(id(it), []).append(dt)
        if id(it) not in info:
            kind, fl, nb = classify(it.op, [t for t in ins if t is not None], out_bytes(it),
                                    it.want)
            info[id(it)] = (kind, it.op.type, fl, nb)
            phases[id(it)] = key[0] if isinstance(key, tuple) else "O"

    ex.exec_item = timed
    order = single_stage_order(MICROBATCHES)[0]
    ex.run_step(order)
    times.clear()
    for _ in range(steps):
        ex.run_step(order)
    ops = [OpSample(*info[k], statistics.median(v), phases[k]) for k, v in times.items()
           if k in info]
    ex.exec_item = run
    resid = _unit_residuals(ex, order, steps, device)
    return ops + [OpSample("action", ph, 0.0, 0.0, r, ph)
                  for r, ph in zip(resid, _unit_phases(order), strict=True)]


def _unit_phases(order: Any) -> list[str]:
    return [ph for a in order for ph in (("B", "W") if a.kind == "BW" else (a.kind,))]


def _unit_residuals(ex: Any, order: Any, steps: int, device: str) -> list[float]:
    """Per F/B/W unit call of a step (in call order), the median over ``steps`` steps of
    the unit's wall seconds minus the summed seconds of its ops (``ex.exec_item`` calls), both
    from the same call; the ops are timed by a lean wrapper (two clock reads per op,
    about 0.1 us each, outside the op times but inside the unit)."""
    run_unit, inner = ex.run_unit, ex.exec_item
    per: list[list[float]] = []
    acc = [0.0]

    def exec_timed(it, mb, env, left, key):
        _sync(device)
        t0 = time.perf_counter()
        inner(it, mb, env, left, key)
        _sync(device)
        acc[0] += time.perf_counter() - t0

    def unit(key, mb, env, left):
        if not isinstance(key, tuple):
            return run_unit(key, mb, env, left)
        acc[0] = 0.0
        _sync(device)
        t0 = time.perf_counter()
        run_unit(key, mb, env, left)
        _sync(device)
        per[-1].append(max(time.perf_counter() - t0 - acc[0], 0.0))
        return None

    ex.run_unit, ex.exec_item = unit, exec_timed
    try:
        for _ in range(steps):
            per.append([])
            ex.run_step(order)
    finally:
        ex.run_unit, ex.exec_item = run_unit, inner
    return [statistics.median(col) for col in zip(*per, strict=True)]
