"""Define-by-run suggestion of one candidate from an Optuna trial.

Parameters are suggested in dependency order and only where they matter (conditional
search space): the mesh first (``tp``, ``pp``; dp follows from the world
size), then ``schedule`` only when pp > 1, ``vpp`` only for VPP (ZBVPP is always 2),
``micro_batch_size``, ``recompute``, ``zero`` only when dp > 1, the HSDP shard group
only with ZeRO-3 and a choice (``fsdp_shard_size_dp{dp}``: one parameter per dp, so its
choices are the same in every trial that suggests it), a mixture-of-experts model's ``ep``
where it has a choice (``ep_dp{dp}``, the same way), and the
annotation knobs only when tp > 1. Every categorical has the same choices in every trial
(Optuna requires it); choices that can never be legal for the problem (a tp that does not
divide the heads, a pp that does not divide the layers) are filtered out up front, the
remaining illegal combinations are returned as a :class:`Violation` for the caller to
prune. Nothing here simulates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tuner import legality as L
from tuner.errors import TunerError
from tuner.space import Candidate, SearchSpace, iter_base_candidates

#: Annotation modes (issue 8 / Paddle auto-parallel's names).
PATTERN, RANDOM, SEMI = "pattern-based", "full_random", "semi-auto"
_TP_RULES = (L.tp_divides_heads, L.tp_divides_kv_heads, L.tp_divides_hidden,
             L.tp_divides_ffn_hidden, L.tp_divides_vocab, L.tp_within_node)
#: Templates that make up Megatron's layout; the norm's sequence-parallel variant is only
#: offered on top of it (the engine realises sequence parallelism on that layout).
MEGATRON_BASE = {"embedding": "vocab_parallel", "attention": "megatron", "mlp": "megatron",
                 "lm_head": "vocab_parallel"}
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


def _cat(trial: optuna.Trial, name: str, choices: Sequence[Any]) -> Any:
    """A categorical suggestion; a single choice is fixed without a parameter."""
    choices = list(choices)
    if not choices:
        trial.set_user_attr("illegal", f"no legal value for {name}")
        raise optuna.TrialPruned(f"no legal value for {name}")
    if len(choices) == 1:
        return choices[0]
    return trial.suggest_categorical(name, choices)


def _templates(trial: optuna.Trial, space: SearchSpace, kinds: Mapping[str, Sequence[str]],
               tp: int, cp: int = 1) -> tuple[tuple[tuple[str, str], ...], bool]:
    """One template per pattern kind (only when tp > 1); returns (templates, sequence
    parallel). The norm's ``sequence_parallel`` template is offered only on the Megatron
    base layout and when sequence parallelism is allowed and legal."""
    if tp == 1:
        return (), False  # nothing is sharded inside a rank: every template is the same plan
    chosen: dict[str, str] = {}
    for kind in TEMPLATE_ORDER:
        if kind not in kinds:
            continue
        opts = list(kinds[kind])
        if kind == "norm":
            base = all(chosen.get(k, MEGATRON_BASE[k]) == MEGATRON_BASE[k] or
                       chosen.get(k) == "tied" for k in MEGATRON_BASE)
            sp_ok = (True in space.sp_choices() and base
                     and (space.problem.seq_len // cp) % tp == 0)
            if not sp_ok:
                opts = [o for o in opts if o != "sequence_parallel"]
            if False not in space.sp_choices() and sp_ok:
                opts = ["sequence_parallel"]
        chosen[kind] = _cat(trial, f"template_{kind}", opts)
    for kind, opts in kinds.items():
        chosen.setdefault(kind, opts[0])
    return tuple(sorted(chosen.items())), chosen.get("norm") == "sequence_parallel"


def suggest_candidate(trial: optuna.Trial, space: SearchSpace, mode: str,
                      template_kinds: Mapping[str, Sequence[str]] | None = None,
                      annotation: str = "megatron") -> Candidate | L.Violation:
    """Suggest one candidate; returns the first :class:`Violation` instead when the point
    is illegal (the caller prunes it). ``template_kinds`` maps pattern kind -> template
    names (pattern-based mode); ``annotation`` names the user's annotation (semi-auto)."""
    p = space.problem
    tp = _cat(trial, "tp", tp_choices(space))
    pp = _cat(trial, "pp", pp_choices(space))
    cps = space.cp_choices()  # suggested only when there is a choice (trials stay as before)
    cp = _cat(trial, "cp", cps) if len(cps) > 1 else cps[0]
    if p.world_size % (tp * pp * cp):
        return L.Violation("mesh_matches_world",
                           f"tp*pp*cp = {tp}*{pp}*{cp} does not divide world size {p.world_size}")
    dp = p.world_size // (tp * pp * cp)
    if "dp" in space.fix and space.fix["dp"] != dp:
        return L.Violation("fixed_dp", f"dp={dp} but --fix dp={space.fix['dp']}")
    v = L.first_violation(Candidate(dp, tp, pp, cp=cp), p, L.MESH_RULES)
    if v is not None:
        return v
    sched = _cat(trial, "schedule", space.schedule_choices()) if pp > 1 else "1F1B"
    if sched == "ZBVPP":
        vpp = 2
    elif sched == "VPP":
        vpp = _cat(trial, "vpp", space.vpp_choices())
    else:
        vpp = 1
    mbs = _cat(trial, "micro_batch_size", space.mbs_choices())
    rc = _cat(trial, "recompute", space.recompute_choices())
    zero = _cat(trial, "zero", space.zero_choices()) if dp > 1 else 0
    shards = space.shard_choices(dp, zero)
    shard = _cat(trial, f"fsdp_shard_size_dp{dp}", shards) if len(shards) > 1 else shards[0]
    fp8s = space.fp8_choices()  # suggested only when there is a choice (trials stay as before)
    fp8 = _cat(trial, "fp8", fp8s) if len(fp8s) > 1 else fp8s[0]
    # a MoE model's expert parallelism, one name per dp: ep for etp = tp; the folded layouts
    # (etp 1, "ep/etp1") only where no other is left (a pinned ep above dp x cp): sampling stays
    # as before, the enumerated space (iter_base_candidates) holds them all
    pairs = space.ep_choices(dp, cp, zero, tp)
    eps = [ep for ep, etp in pairs if etp is None] or [f"{ep}/etp1" for ep, _ in pairs]
    pick = _cat(trial, f"ep_dp{dp}", eps) if len(eps) > 1 else eps[0]
    ep, etp = (pick, None) if isinstance(pick, int) else (int(str(pick).split("/")[0]), 1)
    templates: tuple[tuple[str, str], ...] = ()
    seed = None
    if mode == PATTERN:
        templates, sp = _templates(trial, space, template_kinds or {}, tp, cp)
    else:
        sp = _cat(trial, "sequence_parallel", [s for s in space.sp_choices()
                                               if not s or (p.seq_len // cp) % tp == 0]) if tp > 1 else False
        if mode == RANDOM and tp > 1:
            seed = trial.suggest_int("annotation_seed", 0, 2**31 - 1)
    cand = Candidate(dp, tp, pp, vpp, sched, mbs, rc, zero, bool(sp), templates, seed,
                     "templates" if mode == PATTERN else ("random" if mode == RANDOM else annotation),
                     cp, shard, fp8, ep, etp)
    pinned = _sp_pin_violation(space, cand)
    return pinned or L.first_violation(cand, p) or cand


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
    """Every legal candidate of the space for pattern-based or semi-auto mode (the points
    an exhaustive search visits), without Optuna. full_random has a seed per point and is
    not enumerable (raises ValueError)."""
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
