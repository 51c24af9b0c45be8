"""The per-rank interpreter: runs a :class:`~executor.rank_plan.RankPlan` op by op with the
kernel registry and torch.distributed, in the schedule's action order.

One step: the ``pre`` unit; then every action of this rank's schedule row (F, B, W, or BW
= B then W) on its micro-batch's environment; then the gradients read by the ``step`` unit,
summed over micro-batches and scaled by 1/m; then the ``step`` unit (gradient collectives,
optimizer updates). The step's gradient all_reduces are fused into one bucket per (group,
reduce type, dtype) and issued once, before the updates — as PyTorch DDP and Megatron-LM
bucket gradients (Li et al., VLDB 2020, sec. 3.2.3), and as the simulator's gradient sync
assumes (``simulator.step``: one fused all_reduce per rank). Values die after their last per-micro-batch use; live bytes are
tracked per storage (:mod:`executor.memory`). Sends are posted asynchronously and waited at
the end of the step; receives are waited at once. With a :attr:`RankExecutor.send_order`
(:mod:`executor.p2p_order`), a rank sends to each peer in the order that peer receives --
as NCCL, which matches point-to-point messages by order per pair, requires -- holding a
tensor back when the peer first consumes a message this rank has not produced yet (ZB-V);
every issued p2p op is logged in :attr:`RankExecutor.p2p_log` for the step. A collective whose result only feeds
logging (``shadow_output``, e.g. the data-parallel average of the loss) is issued
asynchronously and waited at the end of the step, as Megatron-LM reports its averaged loss
off the critical path: no compute waits for it, so it costs the step nothing but its
launch (the cost model has no such collective either).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Any

import torch

from completion.ir import Value
from completion.ops.registry import TensorType, get_opdef
from completion.passes.reshard import value_layout
from executor.collectives import (
    COLLECTIVES,
    Groups,
    all_gather,
    all_reduce,
    p2p,
    run_collective,
    wait_work,
)
from executor.cp_data import cp_input
from executor.data import DEFAULT_LR, input_value, is_batch_input, local_block, parameter_value
from executor.errors import ExecutorError
from executor.kernels import KernelContext, get_kernel, torch_dtype
from executor.memory import MemTracker
from executor.profile import COPIES_AVERAGE_LABEL, GRAD_SCALE_LABEL
from executor.rank_plan import Item, RankPlan, is_persistent
from executor.writeback import ALIASES, write_back

MAX_MB = 1024  # p2p tag = program index * MAX_MB + micro-batch


class ExecError(ExecutorError, RuntimeError):
    """A value is missing when an op needs it, or an op cannot run; names rank and op."""


def _unaliased(t: torch.Tensor, ins: list | None) -> bool:
    """True when ``t`` is no view and shares no storage with an operand, so the executor
    may own it (accumulate into it in place)."""
    if ins is None or t._base is not None:
        return False
    ptr = t.untyped_storage().data_ptr()
    return all(x is None or not isinstance(x, torch.Tensor) or x.untyped_storage().data_ptr() != ptr
               for x in ins)



def _is_p2p(op: Any) -> bool:
    """A pipeline send or recv (op family ``p2p`` in the op registry)."""
    return getattr(get_opdef(op.type), "family", None) == "p2p"

def gradient_buckets(items: list[Item], dtype_of: Any) -> dict[tuple, list[Item]]:
    """The step's fused gradient all_reduce buckets: (group, reduce type, dtype) -> the
    ``all_reduce`` items of ``items`` with a group whose operand ``x`` has ``dtype_of(x)``
    not None (the executor: a gradient accumulated this step), in item order."""
    buckets: dict[tuple, list[Item]] = {}
    for it in items:
        x = it.op.operands[0] if it.op.operands else None
        if it.op.type != "all_reduce" or x is None or not it.ro.group:
            continue
        dt = dtype_of(x)
        if dt is None:
            continue
        buckets.setdefault((tuple(it.ro.group), str(it.op.attrs.get("reduce_type") or "sum"), dt), []).append(it)
    return buckets


class RankExecutor:
    """Runs one rank's units. ``batch``: rows of one micro-batch in the program;
    ``num_microbatches``: m; ``seed``: the init/data seed; ``device``: cpu or cuda:N."""

    def __init__(self, plan: RankPlan, groups: Groups, batch: int, num_microbatches: int,
                 seed: int = 0, device: str = "cpu") -> None:
        if num_microbatches > MAX_MB:
            raise ExecError(f"at most {MAX_MB} micro-batches are supported, got {num_microbatches}")
        self.plan, self.groups, self.batch, self.m = plan, groups, batch, num_microbatches
        self.seed, self.device, self.rank = seed, torch.device(device), plan.rank
        self.state: dict[int, torch.Tensor] = {}
        self.mem = MemTracker()
        self.pending: list[tuple[Any, torch.Tensor]] = []
        self.losses: dict[int, torch.Tensor] = {}
        self._step_inputs: dict[int, torch.Tensor] = {}
        self._ctx: dict[int, KernelContext] = {}
        self._deferred: dict[int, tuple[Any, torch.Tensor, int, str]] = {}
        self._late_losses: dict[int, torch.Tensor] = {}
        #: peer rank -> ((send op index, micro-batch), ...) in the order the peer receives
        #: (executor.p2p_order.send_orders); None: send as soon as produced
        self.send_order: dict[int, tuple[tuple[int, int], ...]] | None = None
        self._next_send: dict[int, int] = {}
        self._held: dict[int, dict[tuple[int, int], torch.Tensor]] = {}
        #: ("send" | "recv", peer, send op index, micro-batch) of every p2p op of the step,
        #: in the order this rank issued them
        self.p2p_log: list[tuple[str, int, int, int]] = []
        #: (cp, micro-batch size, tp) of a context-parallel program (its inputs are folded,
        #: executor.cp_data); None otherwise
        self.context_parallel: tuple[int, int, int] | None = None
        #: called with the action's index in the row before each action (progress for
        #: ``executor.watchdog``); None: nothing is reported
        self.on_action: Any = None
        #: ``name -> context manager`` wrapping each fused gradient bucket in a named span
        #: (``executor.profile``: a ``SpanRecorder.span``); None: no span
        self.bucket_span: Any = None
        #: (copy index, rows of a whole global micro-batch, copy group's process group,
        #: copies) of a plan run as expert-data-parallel copies (``executor.expert_copies``):
        #: the copy's rows of each micro-batch, gradients and losses averaged over the
        #: copies; None otherwise
        self.expert_copy: tuple[int, int, Any, int] | None = None

    # -- values ----------------------------------------------------------------------------
    def _source(self, v: Value, env: dict | None, mb: int) -> torch.Tensor:
        ro = self.plan.sources[id(v)]
        op, shape = ro.op, ro.result_shapes[0] or ()
        if op.type == "parameter":
            t = local_block(parameter_value(self.seed, v.name or f"%{v.id}", v.shape, v.dtype),
                            value_layout(v), self.rank)
        elif op.type == "data" and (v.persistable or "init_value" in op.attrs):
            val = op.attrs.get("init_value", DEFAULT_LR if (v.name or "").startswith("learning_rate") else 0.0)
            t = torch.full(shape, float(val), dtype=torch_dtype(v.dtype))
        elif op.type == "data":
            t = self._input(v, mb)
        else:
            t = get_kernel(op.type)([], op.attrs, KernelContext(out_types=(TensorType(shape, v.dtype),)))[0]
        t = t.to(self.device)
        self._put(v, t, self.state if is_persistent(v) else env)
        return t

    def _input(self, v: Value, mb: int) -> torch.Tensor:
        batched = is_batch_input(v, self.batch)
        copy = self.expert_copy
        if id(v) not in self._step_inputs:
            rows = copy[1] if copy is not None and batched else v.shape[0]
            shape = (rows * self.m, *v.shape[1:]) if batched else v.shape
            if self.context_parallel is None:
                self._step_inputs[id(v)] = input_value(self.seed, v, shape)
            else:
                cp, mbs, tp = self.context_parallel
                self._step_inputs[id(v)] = cp_input(self.seed, v, shape, batched, self.rank, cp, mbs, tp)
        glob = self._step_inputs[id(v)]
        if batched and copy is not None:  # copy g's rows of the whole micro-batch
            start = mb * copy[1] + copy[0] * self.batch
            glob = glob[start:start + self.batch]
        elif batched:
            glob = glob[mb * self.batch:(mb + 1) * self.batch]
        return local_block(glob, value_layout(v), self.rank)

    def value(self, v: Value, env: dict | None, mb: int) -> torch.Tensor:
        """The local tensor of ``v`` in micro-batch ``mb``: from the unit's ``env``, the
        rank's state (parameters, optimizer states), or its source (a data input). Raises
        ExecError naming the value when it is not there."""
        k = id(v)
        if env is not None and k in env:
            return env[k]
        if k in self.state:
            return self.state[k]
        if k in self.plan.sources:
            return self._source(v, env, mb)
        raise ExecError(f"rank {self.rank}: value {v.label()} is needed in micro-batch {mb} "
                        f"but was never produced on this rank")

    def _put(self, v: Value, t: torch.Tensor, env: dict | None) -> None:
        if env is None:
            raise ExecError(f"rank {self.rank}: no environment to store {v.label()}")
        old = env.get(id(v))
        if old is not None:
            self.mem.remove(old)
        env[id(v)] = t
        self.mem.add(t)

    def _release(self, v: Value, env: dict, left: Counter) -> None:
        k = id(v)
        left[k] -= 1
        if left[k] <= 0 and k in env:
            self.mem.remove(env.pop(k))

    # -- ops -------------------------------------------------------------------------------
    def _kctx(self, it: Item) -> KernelContext:
        ctx = self._ctx.get(id(it))
        if ctx is None:
            ro = it.ro
            outs = tuple(TensorType(s, v.dtype) if v is not None and s is not None else None
                         for v, s in zip(ro.op.results, ro.result_shapes, strict=False))
            ctx = KernelContext(out_types=outs, in_offsets=it.offsets, device=self.device,
                                group=ro.group, rank=self.rank, want=it.want,
                                in_global=tuple(None if v is None else tuple(v.shape)
                                                for v in ro.op.operands),
                                comm=self._comm_fn(it), extra={"groups": self.groups})
            self._ctx[id(it)] = ctx
        return ctx

    def _comm_fn(self, it: Item):
        """All-reduce over the ranks sharding a dim of one of ``it``'s operands."""

        def comm(t: torch.Tensor, operand: int, dim: int, reduce_type: str) -> torch.Tensor:
            v = it.op.operands[operand]
            lay = value_layout(v) if v is not None else None
            if lay is None or self.rank not in lay.mesh.process_ids:
                return t
            sharders = lay.sharders(dim)
            for m in (reversed(sharders) if reduce_type == "gather" else sharders):
                group = lay.mesh.group_of(self.rank, m)
                if len(group) < 2:
                    continue
                pg = self.groups.get(group)
                if reduce_type == "gather":  # innermost shards first: blocks become contiguous
                    total = sum(lay.local_shape(v.shape, r)[dim] for r in group)
                    t = all_gather(t, dim, len(group), pg, total)
                else:
                    t = all_reduce(t, pg, len(group), reduce_type)
            return t

        return comm

    def _store(self, it: Item, outs: list, env: dict, key: Any, ins: list | None = None) -> None:
        for i, v in enumerate(it.op.results):
            if v is None or (it.want is not None and i not in it.want):
                continue
            t = outs[i] if i < len(outs) else None
            if t is None:
                raise ExecError(f"rank {self.rank}: {it.op.label()} produced no result {i}")
            if key == "pre":
                self._put(v, t, self.state)
                continue
            if key == "step":
                self._put(v, t, env)
                continue
            if id(v) in self.plan.accum:
                acc = self.accum.get(id(v))
                if acc is None:  # the first micro-batch's gradient becomes the accumulator
                    own = self.plan.uses[id(v)] <= 0 and _unaliased(t, ins)
                    self.accum[id(v)] = t if own else t.clone()
                    self.mem.add(self.accum[id(v)])
                else:  # gradient accumulation: one in-place add per later micro-batch
                    acc += t
            if self.plan.uses[id(v)] > 0:
                self._put(v, t, env)

    @staticmethod
    def logging_only(op: Any) -> bool:
        """True for an all_reduce whose result is read only by ``shadow_output`` ops."""
        res = op.results[0] if op.results else None
        return (op.type == "all_reduce" and res is not None and bool(res.uses)
                and all(u.type == "shadow_output" for u, _ in res.uses))

    def _deferred_all_reduce(self, it: Item, x: torch.Tensor) -> torch.Tensor:
        """Post ``it``'s all_reduce asynchronously (completed in :meth:`_finish_deferred`)."""
        group = tuple(it.ro.group or (self.rank,))
        rtype = str(it.op.attrs.get("reduce_type") or "sum")
        out = x.clone()
        if len(group) > 1:
            op = {"sum": torch.distributed.ReduceOp.SUM, "avg": torch.distributed.ReduceOp.SUM,
                  "max": torch.distributed.ReduceOp.MAX, "min": torch.distributed.ReduceOp.MIN}
            if rtype not in op:
                raise ExecutorError(f"unknown reduce_type {rtype!r}")
            work = torch.distributed.all_reduce(out, op=op[rtype], group=self.groups.get(group),
                                                async_op=True)
            self._deferred[id(out)] = (work, out, len(group), rtype)
        return out

    def _finish_deferred(self) -> None:
        """Wait for the logging collectives of the step and record the late losses."""
        for work, out, n, rtype in self._deferred.values():
            wait_work(work)
            if rtype == "avg":
                out /= n
        self._deferred.clear()
        for mb, t in self._late_losses.items():
            self.losses[mb] = t.detach().float().cpu().clone()
        self._late_losses.clear()

    def _unresolved_reshard(self, it: Item, x: torch.Tensor) -> torch.Tensor:
        """A ``reshard`` op the reshard pass did not resolve: in an unpartitioned program
        (no dist attr, e.g. the single-process reference of a program text with a forward
        reshard) it moves nothing, so it is the identity; with a layout it would need
        collectives, so it is refused (ExecError naming the op) rather than run as a
        relabel."""
        d = it.op.dist_attr
        if d is None or all(a is None or a.process_mesh.size == 1 for a in (*d.operands, *d.results)):
            return x
        raise ExecError(f"rank {self.rank}: {it.op.label()} is an unresolved reshard "
                        f"({list(d.operands)} -> {list(d.results)}); run apply_reshard_pass first")

    def exec_item(self, it: Item, mb: int, env: dict, left: Counter | None, key: Any) -> None:
        """Run one op of a unit (the hook calibration wraps to time ops one by one)."""
        op, ro = it.op, it.ro
        ins = [None if v is None else self.value(v, env, mb) for v in op.operands]
        try:
            if op.type in COLLECTIVES and self.logging_only(op):
                outs = [self._deferred_all_reduce(it, ins[0])]
            elif op.type in COLLECTIVES:
                outs = [run_collective(op.type, ins[0], op.attrs, self.rank, ro.group or (self.rank,),
                                       self.groups, ro.result_shapes[0] or ())]
            elif op.type == "reshard":
                outs = [self._unresolved_reshard(it, ins[0])]
            elif op.type == "shadow_output":
                if op.operands[0] is self.plan.loss and id(ins[0]) in self._deferred:
                    self._late_losses[mb] = ins[0]
                elif op.operands[0] is self.plan.loss:
                    self.losses[mb] = ins[0].detach().float().cpu().clone()
                outs = []
            else:
                outs = get_kernel(op.type)(ins, op.attrs, self._kctx(it))
        except (ValueError, RuntimeError) as e:
            raise ExecError(f"rank {self.rank}: {op.label()} failed: {e}") from e
        self._store(it, outs, env, key, ins)
        if key == "step" and op.type in ALIASES:
            write_back(op, ins, outs, self.state, self.rank, self.groups)
        if left is not None:
            for v in op.operands:
                if v is not None:
                    self._release(v, env, left)

    def _ordered(self, key: Any, peer: int) -> bool:
        return (self.send_order is not None and peer in self.send_order
                and key not in ("pre", "step"))

    def _release_sends(self, peer: int, ops: list) -> None:
        """Append to ``ops`` the held sends to ``peer`` that are next in its receive order."""
        order, held = self.send_order[peer], self._held.setdefault(peer, {})
        i = self._next_send.get(peer, 0)
        while i < len(order) and order[i] in held:
            idx, mb = order[i]
            t = held.pop(order[i])
            self.mem.remove(t)  # a held tensor counts as live until it goes out
            ops.append(("send", t, peer, idx * MAX_MB + mb))
            i += 1
        self._next_send[peer] = i

    def _check_sends_done(self) -> None:
        """Raise ExecError when a send the peers expect was never produced or is still held."""
        for peer, order in (self.send_order or {}).items():
            i = self._next_send.get(peer, 0)
            if i < len(order) or self._held.get(peer):
                left = order[i] if i < len(order) else next(iter(self._held[peer]))
                raise ExecError(f"rank {self.rank}: send (op {left[0]}, micro-batch {left[1]}) to "
                                f"rank {peer} was not issued by the end of the step "
                                f"({i} of {len(order)} sends in rank {peer}'s receive order)")

    def _p2p(self, items: list[Item], mb: int, env: dict, left: Counter | None, key: Any) -> None:
        ops, recvs = [], []
        for it in items:
            op = it.op
            if op.type == "send":
                t = self.value(op.operands[0], env, mb).contiguous()
                for a, b in op.attrs["pairs"]:
                    if a != self.rank:
                        continue
                    if self._ordered(key, b):
                        self._held.setdefault(b, {})[(it.index, mb)] = t
                        self.mem.add(t)
                        self._release_sends(b, ops)
                    else:
                        ops.append(("send", t, b, it.index * MAX_MB + mb))
            else:
                shape = it.ro.result_shapes[0] or ()
                buf = torch.empty(shape, dtype=torch_dtype(op.attrs.get("dtype")), device=self.device)
                src = it.ro.group[0] if it.ro.group else None
                if src is None:
                    raise ExecError(f"rank {self.rank}: {op.label()} has no sender for this rank")
                ops.append(("recv", buf, src, (it.index - 1) * MAX_MB + mb))
                recvs.append((it, buf, len(ops) - 1))
        self.p2p_log.extend((kind, peer, tag // MAX_MB, tag % MAX_MB) for kind, _, peer, tag in ops)
        works = p2p(ops)
        wait_all = bool(works) and torch.distributed.get_backend() == "nccl"
        for i, w in enumerate(works):
            if wait_all or ops[i][0] == "recv":
                wait_work(w)
            else:
                self.pending.append((w, ops[i][1]))
        for it, buf, _ in recvs:
            self._store(it, [buf], env, key)
        if left is not None:
            for it in items:
                if it.op.type == "send":
                    self._release(it.op.operands[0], env, left)

    def _aside_span(self, name: str) -> Any:
        """A recorder span ``name`` (``bucket_span``, set while ``executor.profile`` records
        a step) around step work that is no op of the plan, else a no-op context: the
        span keeps that work out of the step's uncovered host time
        (``executor.trace_rounds.step_gap``), which the cost model charges elsewhere."""
        return contextlib.nullcontext() if self.bucket_span is None else self.bucket_span(name)

    def _bucketed_all_reduce(self, items: list[Item], env: dict) -> set[int]:
        """Fuse the step's gradient all_reduces (operand already in ``env``) into one
        all_reduce per (group, reduce type, dtype); returns the ids of the items done."""
        buckets = gradient_buckets(items, lambda x: env[id(x)].dtype if id(x) in env else None)
        done: set[int] = set()
        for b, ((group, rtype, _), its) in enumerate(buckets.items()):
            span = contextlib.nullcontext()
            if self.bucket_span is not None:
                from executor.profile import bucket_label

                span = self.bucket_span(bucket_label(b))
            with span:
                ins = [env[id(it.op.operands[0])] for it in its]
                flat = torch.cat([t.reshape(-1) for t in ins])
                self.mem.add(flat)
                try:
                    out = all_reduce(flat, self.groups.get(group), len(group), rtype)
                except (ValueError, RuntimeError) as e:
                    raise ExecError(f"rank {self.rank}: fused gradient all_reduce over {list(group)} "
                                    f"failed: {e}") from e
                self.mem.remove(flat)
            offset = 0
            for it, t in zip(its, ins, strict=True):
                self._store(it, [out[offset:offset + t.numel()].view(t.shape)], env, "step")
                offset += t.numel()
                done.add(id(it))
        return done

    def run_unit(self, key: Any, mb: int, env: dict, left: Counter | None) -> None:
        """Run the items of unit ``key`` for micro-batch ``mb`` (consecutive send/recv
        items go out as one batched p2p; the step's gradient all_reduces as one bucket)."""
        items = self.plan.units.get(key, [])
        done = self._bucketed_all_reduce(items, env) if key == "step" else set()
        i = 0
        while i < len(items):
            if id(items[i]) in done:
                i += 1
            elif _is_p2p(items[i].op):
                j = i
                while j < len(items) and _is_p2p(items[j].op):
                    j += 1
                self._p2p(items[i:j], mb, env, left, key)
                i = j
            else:
                self.exec_item(items[i], mb, env, left, key)
                i += 1

    # -- a step ----------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def run_step(self, actions) -> list[tuple]:
        """One training step over this rank's schedule row. Returns the actions' timings
        ``(kind, stage, microbatch, chunk, start_s, end_s)`` relative to the step start, the
        optimizer phase as kind ``"O"``; losses per micro-batch are in ``self.losses``."""
        envs = {mb: {} for mb in range(self.m)}
        lefts = {mb: Counter(self.plan.uses) for mb in range(self.m)}
        self.accum, self.losses = {}, {}
        self._step_inputs.clear()
        self._next_send, self._held, self.p2p_log = {}, {}, []
        t_start = self._now()
        self.run_unit("pre", 0, self.state, None)
        times = []
        for i, a in enumerate(actions):
            if self.on_action is not None:
                self.on_action(i)
            t0 = self._now()
            for kind in (("B", "W") if a.kind == "BW" else (a.kind,)):
                self.run_unit((kind, a.chunk), a.microbatch, envs[a.microbatch], lefts[a.microbatch])
            times.append((a.kind, a.stage, a.microbatch, a.chunk, t0 - t_start, self._now() - t_start))
        self._check_sends_done()
        t0 = self._now()
        step_env = {}
        with self._aside_span(GRAD_SCALE_LABEL):
            for k, t in self.accum.items():  # mean over micro-batches, in place (owned)
                step_env[k] = t.div_(self.m) if self.m > 1 else t
        if self.expert_copy is not None:
            with self._aside_span(COPIES_AVERAGE_LABEL):
                self._average_over_copies(step_env)
        self.run_unit("step", 0, step_env, None)
        for w, _ in self.pending:
            wait_work(w)
        self.pending.clear()
        self._finish_deferred()
        times.append(("O", -1, -1, -1, t0 - t_start, self._now() - t_start))
        for env in [*envs.values(), step_env]:
            for t in env.values():
                self.mem.remove(t)
        self.accum = {}
        return times

    def _average_over_copies(self, env: dict) -> None:
        """Average the step's floating tensors of ``env`` (the gradients the update reads)
        over the expert-data-parallel copies, one fused all_reduce (``executor.expert_copies``)."""
        _, _, pg, n = self.expert_copy
        # the same order on every copy: by the program's value id (object ids differ per process)
        keys = sorted((k for k, t in env.items() if t.is_floating_point()),
                      key=lambda k: self.plan.values[k].id if k in self.plan.values else -1)
        if not keys or n < 2:
            return
        flat = torch.cat([env[k].reshape(-1) for k in keys])
        out = all_reduce(flat, pg, n, "avg")
        offset = 0
        for k in keys:
            t = env[k]
            t.copy_(out[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()

    def average_losses_over_copies(self) -> None:
        """Average this step's per-micro-batch losses over the copies (in place)."""
        if self.expert_copy is None or self.expert_copy[3] < 2:
            return
        _, _, pg, n = self.expert_copy
        for mb, t in self.losses.items():
            self.losses[mb] = all_reduce(t, pg, n, "avg")

    def parameters(self) -> dict[str, tuple[Any, Any]]:
        """name -> (local block as numpy, layout, global shape) of every parameter this rank
        holds."""
        out = {}
        for k, t in self.state.items():
            v = self.plan.values.get(k)
            if v is not None and v.is_parameter:
                out[v.name or f"%{v.id}"] = (t.detach().float().cpu().numpy().copy(), value_layout(v),
                                             tuple(v.shape))
        return out
