"""The legal candidates of a search space, per annotation mode (:func:`enumerate_candidates`).

Knobs take values only where they matter: the mesh first (``tp``, ``pp``, ``cp``; dp
follows from the world size), then ``schedule`` only when pp > 1, ``vpp`` only for VPP
(ZBVPP is always 2), ``micro_batch_size``, ``recompute``, ``zero`` only when dp > 1, the
HSDP shard group only with ZeRO-3, a mixture-of-experts model's ``ep``, and the
annotation knobs (pattern templates, sequence parallelism) only when tp > 1. Choices that
can never be legal for the problem (a tp that does not divide the heads, a pp above the
layers) are filtered out up front, every other combination by the rules of
:mod:`tuner.legality`. A sampled search draws from these candidates only
(:mod:`tuner.legal_draw`); the branch and bound visits them (:mod:`tuner.exhaustive`).
Nothing here simulates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from completion.choices import MODES
from tuner import legality as L
from tuner.errors import TunerError
from tuner.space import Candidate, SearchSpace, iter_base_candidates

#: Annotation modes (issue 8 / Paddle auto-parallel's names) and ``framework`` (issue 36):
#: the layout the frameworks run, Megatron's tensor parallelism (column- and row-parallel
#: attention and MLP, vocab-parallel embedding and head, the sequence-parallel norm where
#: sp), the same candidates as ``semi-auto`` with the ``megatron`` annotation.
FRAMEWORK, PATTERN, RANDOM, SEMI = MODES  # completion.choices.MODES, the one list
_TP_RULES = (L.tp_divides_heads, L.tp_divides_kv_heads, L.tp_divides_hidden,
             L.tp_divides_ffn_hidden, L.tp_divides_vocab, L.tp_within_node)
#: Templates that make up Megatron's layout (``tuner.legality.MEGATRON_BASE``); the norm's
#: sequence-parallel variant is only offered on top of it (the engine realises sequence
#: parallelism on that layout).
MEGATRON_BASE = L.MEGATRON_BASE
TEMPLATE_ORDER = ("embedding", "attention", "mlp", "lm_head", "norm")


def tp_choices(space: SearchSpace) -> list[int]:
    """tp values that pass every rule reading only tp (heads, hidden, vocab, node); with
    sequence parallelism pinned on, tp > 1 only (SP shards the sequence over tp)."""
    p = space.problem
    sp_on = space.fix.get("sequence_parallel") is True
    return [m for m in space.tp_choices()
            if all(r(Candidate(1, m, 1), p) is None for r in _TP_RULES) and not (sp_on and m == 1)]


def pp_choices(space: SearchSpace) -> list[int]:
    """pp values that pass ``pp_divides_layers``."""
    p = space.problem
    return [q for q in space.pp_choices() if L.pp_divides_layers(Candidate(1, 1, q), p) is None]


def _sp_pin_violation(space: SearchSpace, c: Candidate) -> L.Violation | None:
    """A pinned sequence_parallel (``--sequence-parallel`` / ``--fix sp=true``) the
    candidate cannot honour: tp = 1, or intra-op templates without Megatron's sequence-
    parallel norm; such a candidate is illegal, never silently run with SP off."""
    want = space.fix.get("sequence_parallel")
    if want is None or c.sequence_parallel == want:
        return None
    why = "tp=1 has no sequence to shard" if c.tp == 1 else "its intra-op templates do not run SP"
    return L.Violation("fixed_sequence_parallel",
                       f"sequence_parallel={c.sequence_parallel} but --fix sequence_parallel={want} ({why})")


def _template_sets(space: SearchSpace, kinds: Mapping[str, Sequence[str]], tp: int
                   ) -> list[tuple[tuple[tuple[str, str], ...], bool]]:
    """Every (templates, sequence parallel) the conditional suggestion can produce."""
    if tp == 1:
        return [((), False)]
    free = [k for k in TEMPLATE_ORDER if k in kinds and k != "norm"]
    out = []
    for combo in itertools.product(*(kinds[k] for k in free)):
        chosen = dict(zip(free, combo, strict=True))
        if "norm" in kinds:
            base = all(chosen.get(k, MEGATRON_BASE[k]) in (MEGATRON_BASE[k], "tied")
                       for k in MEGATRON_BASE)
            sp_ok = True in space.sp_choices() and base and space.problem.seq_len % tp == 0
            opts = [o for o in kinds["norm"] if o != "sequence_parallel" or sp_ok]
            if False not in space.sp_choices() and sp_ok:
                opts = ["sequence_parallel"]
            norms = opts
        else:
            norms = [None]
        for n in norms:
            full = dict(chosen) | ({"norm": n} if n else {})
            for kind, o in kinds.items():
                full.setdefault(kind, o[0])
            out.append((tuple(sorted(full.items())), n == "sequence_parallel"))
    return out


def enumerate_candidates(space: SearchSpace, mode: str,
                         template_kinds: Mapping[str, Sequence[str]] | None = None,
                         annotation: str = "megatron") -> list[Candidate]:
    """Every legal candidate of the space for framework, pattern-based or semi-auto mode
    (the points an exhaustive search visits), without Optuna; framework mode is semi-auto
    with the ``megatron`` annotation. full_random has a seed per point and is not
    enumerable (raises TunerError)."""
    if mode == FRAMEWORK:
        mode, annotation = SEMI, "megatron"
    if mode == RANDOM:
        raise TunerError("full_random draws an annotation seed per trial; it cannot be enumerated")
    allowed_tp, allowed_pp = set(tp_choices(space)), set(pp_choices(space))
    out, seen = [], set()
    for c in iter_base_candidates(space):
        if c.tp not in allowed_tp or c.pp not in allowed_pp:
            continue
        if c.pp == 1 and c.schedule != "1F1B":
            continue
        if mode == PATTERN:  # SP comes from the norm template: one base per SP pair
            if c.sequence_parallel and False in space.sp_choices():
                continue
            variants = [c.replace(templates=t, sequence_parallel=sp, annotation="templates")
                        for t, sp in _template_sets(space, template_kinds or {}, c.tp)]
        else:
            variants = [c.replace(annotation=annotation)]
        for v in variants:
            if _sp_pin_violation(space, v) is None and L.is_legal(v, space.problem) and v.key() not in seen:
                seen.add(v.key())
                out.append(v)
    return out
