"""Sampling only legal plans: the enumerated legal candidates as a decision tree over the
knobs, walked by an Optuna trial (issue 36 item 3).

A sampler that draws each knob on its own proposes plans the legality rules refuse (a tp
x pp that does not divide the world, a micro-batch that does not divide the batch, ...);
such draws cost trials and teach the sampler nothing. Here the legal candidates of the
space (``tuner.suggest.enumerate_candidates``: the rules of ``tuner.legality`` applied to
every combination) are arranged as a tree whose levels are the knobs (:data:`LEVELS`,
then one level per pattern template in pattern-based mode): a node's children are the
values of its knob that at least one legal candidate below it takes. A trial walks from
the root, suggesting each knob among its node's children only (one child: no parameter),
so every walk ends on a legal candidate and no choice leads to a dead end.

Optuna needs a parameter to have the same choices in every trial that suggests it, so a
knob whose choices at a node differ from the knob's full list is suggested under a name
that carries them (``micro_batch_size[1|2]``): the same name always means the same
choices, and nodes with the same legal choices share their parameter (TPE learns from all
of them). full_random draws its annotation seed (``annotation_seed``) after the walk, for
a tp > 1 plan; the tree holds its tp = 1 plans and its tp > 1 bases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from tuner.legality import is_legal
from tuner.space import Candidate, SearchSpace
from tuner.suggest import PATTERN, RANDOM, SEMI, TEMPLATE_ORDER, enumerate_candidates

#: the knob levels of the tree, in the order a trial suggests them (mesh first)
LEVELS: tuple[tuple[str, Callable[[Candidate], Any]], ...] = (
    ("tp", lambda c: c.tp), ("pp", lambda c: c.pp), ("cp", lambda c: c.cp),
    ("schedule", lambda c: c.schedule), ("vpp", lambda c: c.vpp),
    ("micro_batch_size", lambda c: c.micro_batch_size), ("recompute", lambda c: c.recompute),
    ("zero", lambda c: c.zero), ("fsdp_shard_size", lambda c: c.fsdp_shard_size),
    ("fp8", lambda c: c.fp8), ("ep", lambda c: c.ep), ("etp", lambda c: c.etp),
    ("sequence_parallel", lambda c: c.sequence_parallel),
)


def _template(kind: str) -> tuple[str, Callable[[Candidate], Any]]:
    return f"template_{kind}", lambda c: dict(c.templates).get(kind)


def _order(v: Any) -> tuple[Any, ...]:
    """A total order over a knob's values (None last; numbers by value)."""
    return (v is None, type(v).__name__, v if v is not None else 0)


class LegalTree:
    """The legal candidates of a space as a tree over the knobs (module docstring).

    Args:
        candidates: the legal candidates (``enumerate_candidates``), at least one.
        templates: pattern-based mode: add one level per pattern kind.
    Attributes: size (candidates), names (level -> the knob's full choice list)."""

    def __init__(self, candidates: Sequence[Candidate], templates: bool = False) -> None:
        self.levels = LEVELS[:-1] + tuple(_template(k) for k in TEMPLATE_ORDER) + LEVELS[-1:] \
            if templates else LEVELS
        self.size = len(candidates)
        self.root: dict[Any, Any] = {}
        full: list[set[Any]] = [set() for _ in self.levels]
        for c in candidates:
            node = self.root
            for d, (_, get) in enumerate(self.levels):
                v = get(c)
                full[d].add(v)
                if d == len(self.levels) - 1:
                    node.setdefault(v, c)
                else:
                    node = node.setdefault(v, {})
        self.full = [tuple(sorted(s, key=_order)) for s in full]

    def _name(self, depth: int, choices: tuple[Any, ...]) -> str:
        """The parameter name of a level with ``choices`` (module docstring)."""
        name = self.levels[depth][0]
        if choices == self.full[depth]:
            return name
        return f"{name}[{'|'.join(str(v) for v in choices)}]"

    def walk(self, pick: Callable[[str, tuple[Any, ...]], Any]) -> Candidate:
        """The candidate reached by choosing at each node ``pick(name, choices)`` (only
        where a node has more than one child)."""
        node: Any = self.root
        for depth in range(len(self.levels)):
            choices = tuple(sorted(node, key=_order))
            v = choices[0] if len(choices) == 1 else pick(self._name(depth, choices), choices)
            node = node[v]
        return node

    def draw(self, trial: optuna.Trial) -> Candidate:
        """A legal candidate suggested by ``trial`` (categoricals over legal choices)."""
        return self.walk(lambda name, choices: trial.suggest_categorical(name, list(choices)))

    def params_of(self, c: Candidate) -> dict[str, Any]:
        """The trial parameters under which :meth:`draw` suggests ``c`` (for
        ``study.enqueue_trial``). Raises KeyError when ``c`` is not in the tree."""
        out: dict[str, Any] = {}
        node: Any = self.root
        for depth, (_, get) in enumerate(self.levels):
            v = get(c)
            choices = tuple(sorted(node, key=_order))
            if len(choices) > 1:
                out[self._name(depth, choices)] = v
            node = node[v]
        if c.annotation_seed is not None:
            out["annotation_seed"] = c.annotation_seed
        return out


def legal_tree(space: SearchSpace, mode: str, template_kinds: Mapping[str, Sequence[str]] | None = None,
               annotation: str = "megatron") -> LegalTree | None:
    """The :class:`LegalTree` of the space in ``mode`` (full_random: its plans without the
    annotation seed, which :func:`draw_candidate` adds); None when no plan is legal."""
    if mode == RANDOM:
        cands = [c for c in (c.replace(annotation="random") for c in enumerate_candidates(space, SEMI))
                 if is_legal(c, space.problem)]
    else:
        cands = enumerate_candidates(space, mode, template_kinds, annotation)
    return LegalTree(cands, templates=mode == PATTERN) if cands else None


def draw_candidate(tree: LegalTree, trial: optuna.Trial, mode: str) -> Candidate:
    """A legal candidate of ``tree`` drawn by ``trial``; full_random adds a random
    annotation seed to a tp > 1 plan (``annotation_seed``)."""
    c = tree.draw(trial)
    if mode == RANDOM and c.tp > 1:
        c = c.replace(annotation_seed=trial.suggest_int("annotation_seed", 0, 2**31 - 1))
    return c


__all__ = ["LEVELS", "LegalTree", "draw_candidate", "legal_tree"]
