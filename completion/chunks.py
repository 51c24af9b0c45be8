"""Pipeline chunk assignment: which stage and which virtual chunk each op runs in.

Layers are found by ``seg_method``, a regular expression searched in each forward op's
struct name (default: ``layers.<i>``, matching ``decoder.layers.3.mlp.up_proj``); the
layer key is the first group when the regex has one, else the whole match. The layers,
in order of first appearance, are split into ``pp_degree * vpp_degree`` contiguous
segments: of equal size by default (Megatron-LM's rule: the layer count must divide), or of
the sizes ``layers_per_segment`` gives (uneven splits, e.g. the Zero Bubble paper's
first and last stages with one layer less; a size may be 0). Segment k goes to:

- ``VPP`` (interleaved 1F1B, Narayanan et al. 2021, sec. 2.2) and the non-interleaved
  schedules (``FThenB``, ``1F1B``, ``ZBH1``, ``ZBH2``; vpp_degree 1): stage ``k mod pp``,
  chunk ``k // pp``;
- ``ZBVPP`` (ZB-V, Qi et al. 2024, sec. 6) and ``DualPipeV`` (DeepSeek-V3's DualPipe cut in
  half): a V — chunk ``c = k // pp`` runs over stages ``0..p-1`` when c is even and
  ``p-1..0`` when c is odd.

Ops outside any layer: forward ops before the first layer go to segment 0 (embeddings),
later ones to the segment of the last layer seen (final norm, head, loss: reference case
12); an op without operands (data, parameter, full) to the segment of its first consumer;
a backward op to its own layer when its struct name matches, else the highest segment of
its operands' forward producers, else the lowest of its operands' producers (gradient
accumulation belongs with the value it accumulates for); an optimizer op to its
parameter's segment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from completion.choices import INTERLEAVED
from completion.errors import CompletionError
from completion.ir import Operation, OpRole, Program

DEFAULT_SEG_METHOD = r"layers\.(\d+)(?:\.|$)"
SCHEDULES = {"fthenb": "FThenB", "1f1b": "1F1B", "vpp": "VPP", "zbh1": "ZBH1", "zbh2": "ZBH2",
             "zbvpp": "ZBVPP", "zbv": "ZBVPP", "zb-v": "ZBVPP", "dualpipev": "DualPipeV"}
#: two chunks per rank in a V (``completion.strategy.V_SHAPED``)
V_SHAPED = ("ZBVPP", "DualPipeV")


@dataclass
class ChunkPlan:
    """Result of :func:`assign_chunks`: per op (by ``id``) its segment, stage and chunk,
    and the layer keys in order."""

    pp_degree: int
    vpp_degree: int
    schedule_mode: str
    layers: list[str]
    segment: dict[int, int] = field(default_factory=dict)
    stage: dict[int, int] = field(default_factory=dict)
    chunk: dict[int, int] = field(default_factory=dict)

    def place(self, segment: int) -> tuple[int, int]:
        """(stage, chunk) of a segment under the schedule."""
        p = self.pp_degree
        c, pos = divmod(segment, p)
        if self.schedule_mode in V_SHAPED and c % 2 == 1:
            return p - 1 - pos, c
        return pos, c


def check_degrees(pp_degree: int, vpp_degree: int, schedule_mode: str) -> str:
    """Validate and return the canonical schedule name. Raises CompletionError."""
    for nm, v in (("pp_degree", pp_degree), ("vpp_degree", vpp_degree)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CompletionError(f"{nm} must be a positive int, got {v!r}")
    mode = SCHEDULES.get(str(schedule_mode).lower())
    if mode is None:
        raise CompletionError(
            f"unknown schedule_mode {schedule_mode!r}; expected one of {sorted(set(SCHEDULES.values()))}")
    if vpp_degree > 1 and mode not in INTERLEAVED:
        raise CompletionError(f"vpp_degree {vpp_degree} > 1 needs schedule_mode VPP or ZBVPP, got {mode}")
    return mode


def _layer_keys(ops: list[Operation], rx: re.Pattern[str]) -> dict[int, str]:
    keys: dict[int, str] = {}
    for op in ops:
        m = rx.search(op.struct_name) if op.struct_name else None
        if m is not None:
            keys[id(op)] = m.group(1) if rx.groups else m.group(0)
    return keys


def segment_of_layers(num_layers: int, num_segments: int,
                      layers_per_segment: Sequence[int] | None = None) -> list[int]:
    """Segment index of each of ``num_layers`` layers in model order: contiguous segments of
    the given sizes, else of equal size. Raises CompletionError when the sizes are not
    ``num_segments`` integers >= 0 summing to ``num_layers``, or (equal split) when
    ``num_segments`` does not divide ``num_layers``."""
    if layers_per_segment is None:
        if num_layers % num_segments:
            raise CompletionError(
                f"{num_layers} layers cannot be split evenly into {num_segments} segments "
                f"(pp_degree * vpp_degree); give layers_per_stage for an uneven split")
        return [i // (num_layers // num_segments) for i in range(num_layers)]
    sizes = list(layers_per_segment)
    if len(sizes) != num_segments or any(not isinstance(n, int) or n < 0 for n in sizes) \
            or sum(sizes) != num_layers:
        raise CompletionError(f"layers_per_stage {sizes} must be {num_segments} integers >= 0 "
                              f"summing to the program's {num_layers} layers")
    return [k for k, n in enumerate(sizes) for _ in range(n)]


def assign_chunks(program: Program, pp_degree: int, vpp_degree: int = 1,
                  schedule_mode: str = "1F1B", seg_method: str = DEFAULT_SEG_METHOD,
                  layers_per_segment: Sequence[int] | None = None) -> ChunkPlan:
    """Segment ``program`` (module docstring); sets ``op.chunk_id`` and returns the plan.

    ``layers_per_segment``: layers per segment (virtual stage) in model order; None splits
    evenly. Raises CompletionError for bad degrees, an invalid regex, a regex that matches
    no op, or a split that does not fit (see :func:`segment_of_layers`).
    """
    mode = check_degrees(pp_degree, vpp_degree, schedule_mode)
    try:
        rx = re.compile(seg_method)
    except re.error as e:
        raise CompletionError(f"seg_method {seg_method!r} is not a valid regex: {e}") from None
    ops = program.ops
    fwd = [op for op in ops if op.role in (OpRole.FORWARD, OpRole.LOSS)]
    keys = _layer_keys(ops, rx)
    layers: list[str] = []
    for op in fwd:
        k = keys.get(id(op))
        if k is not None and k not in layers:
            layers.append(k)
    nseg = pp_degree * vpp_degree
    if not layers:
        raise CompletionError(f"seg_method {seg_method!r} matches no forward op's struct name")
    if layers_per_segment is None and len(layers) % nseg:
        raise CompletionError(
            f"{len(layers)} layers cannot be split evenly into pp_degree * vpp_degree = "
            f"{pp_degree} * {vpp_degree} = {nseg} segments")
    segs = segment_of_layers(len(layers), nseg, layers_per_segment)
    seg_of_layer = {k: segs[i] for i, k in enumerate(layers)}
    plan = ChunkPlan(pp_degree, vpp_degree, mode, layers)
    _segment_ops(program, keys, seg_of_layer, plan.segment)
    for op in ops:
        s, c = plan.place(plan.segment[id(op)])
        plan.stage[id(op)], plan.chunk[id(op)] = s, c
        op.chunk_id = c
    return plan


def _segment_ops(program: Program, keys: dict[int, str], seg_of_layer: dict[str, int],
                 seg: dict[int, int]) -> None:
    ops = program.ops
    last = 0
    sources = []
    for op in ops:
        if op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        if not op.operands:
            sources.append(op)
            continue
        k = keys.get(id(op))
        last = seg_of_layer[k] if k is not None else last
        seg[id(op)] = last
    prev = last
    for op in ops:
        if op.role != OpRole.BACKWARD:
            continue
        if not op.operands:
            sources.append(op)
            continue
        k = keys.get(id(op))
        if k is not None:
            prev = seg_of_layer[k]
        else:
            fwd = [seg[id(v.op)] for v in op.operands
                   if v is not None and v.op is not None and id(v.op) in seg
                   and v.op.role in (OpRole.FORWARD, OpRole.LOSS)]
            anyp = [seg[id(v.op)] for v in op.operands
                    if v is not None and v.op is not None and id(v.op) in seg]
            prev = max(fwd) if fwd else (min(anyp) if anyp else prev)
        seg[id(op)] = prev
    _segment_sources(ops, sources, seg)
    for op in ops:
        if id(op) in seg:
            continue
        p = op.operands[0] if op.operands else None
        seg[id(op)] = seg.get(id(p.op), 0) if p is not None and p.op is not None else 0


def _segment_sources(ops: list[Operation], sources: list[Operation], seg: dict[int, int]) -> None:
    pos = {id(op): i for i, op in enumerate(ops)}
    for op in sources:
        firsts = [u for v in op.results if v is not None for u, _ in v.uses]
        firsts = [u for u in firsts if id(u) in seg]
        if firsts:
            u = min(firsts, key=lambda o: pos[id(o)])
            seg[id(op)] = seg[id(u)]
    for op in sources:
        if id(op) not in seg:
            uses = [u for v in op.results if v is not None for u, _ in v.uses]
            seg[id(op)] = 0
            for u in sorted(uses, key=lambda o: pos[id(o)]):
                p = u.operands[0] if u.operands else None
                if p is not None and p.op is not None and id(p.op) in seg:
                    seg[id(op)] = seg[id(p.op)]
                    break
