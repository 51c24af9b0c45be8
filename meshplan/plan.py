"""``Plan``: everything needed to reproduce one candidate (model reference, cluster, strategy,
annotations), with a JSON round trip."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from completion.errors import InputFileNotFoundError
from completion.json_keys import unique_keys
from completion.models.config import MAX_MODEL_SIZES
from completion.nesting import json_depth
from meshplan.errors import MeshplanError
from meshplan.strategy import Strategy, StrategyError

PLAN_VERSION = 2
#: plan versions this meshplan reads (version 1 spelled mp, schedule_mode, sharding_stage)
READABLE_VERSIONS = (1, 2)
#: Deepest nesting a plan document may have (a plan needs 4: plan -> strategy ->
#: annotation -> placements); deeper JSON is refused before it is walked, so a hostile
#: file cannot exhaust the recursion limit.
MAX_JSON_DEPTH = 16
#: Largest plan file read (bytes): a plan is a few KiB; annotations of a big program a few
#: hundred.
MAX_PLAN_BYTES = 16 * 2**20
#: Bounds of the plan's sizes (issue 16 item 8): tokens per sequence and decoder layers as
#: a model config may give them (``completion.models.config.MAX_MODEL_SIZES``), nodes as
#: a cluster may have ranks (``clusters.spec.MAX_WORLD_SIZE``).
MAX_SEQ_LEN = MAX_MODEL_SIZES["seq_len"]
MAX_LAYERS = MAX_MODEL_SIZES["num_layers"]
MAX_NODES = 2**20
_BOUNDS = {"nodes": MAX_NODES, "seq_len": MAX_SEQ_LEN, "num_layers": MAX_LAYERS}


class PlanError(MeshplanError):
    """A malformed plan document; names the field at fault."""


def _annotations(data: Mapping[str, Any]) -> dict[str, list[str]]:
    ann = data.get("annotations")
    ann = {} if ann is None else ann
    if not isinstance(ann, Mapping):
        raise PlanError(f"plan field 'annotations' must be a mapping value name -> placements, "
                        f"got {type(ann).__name__}")
    return dict(ann)


@dataclass(frozen=True)
class Plan:
    """A reproducible candidate.

    Attributes:
        model: a built-in model name (``llama2-7b``), a ``config.json`` path or a PIR
            program text path.
        cluster: a catalog cluster name or a cluster YAML path; nodes: node count (None =
            the spec's default).
        strategy: the :class:`Strategy`.
        seq_len: tokens per sequence (None = the model's default).
        annotations: value name -> placements, applied on top of the strategy's
            annotation (mesh dims in the order dp, mp).
        num_layers: decoder layers to cost (None = the model's own; see ``Engine``).
        search: what the search that chose this plan knew of it (``meshplan tune``: the
            predicted step and peak memory, the proven lower bound on the optimum and the
            gap, ``tuner.gap.SearchAnswer``); metadata, not part of the plan (not
            compared, never read by the cost model). None: not written by a search.
    """

    model: str
    cluster: str
    strategy: Strategy
    nodes: int | None = None
    seq_len: int | None = None
    annotations: dict[str, list[str]] = field(default_factory=dict)
    num_layers: int | None = None
    search: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("model", "cluster"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise PlanError(f"plan field {name!r} must be a non-empty string, got {v!r}")
        if not isinstance(self.strategy, Strategy):
            raise PlanError(f"plan field 'strategy' must be a Strategy, got {type(self.strategy).__name__}")
        for name, most in _BOUNDS.items():
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PlanError(f"plan field {name!r} must be an integer >= 1 or null, got {v!r}")
            if v is not None and v > most:
                raise PlanError(f"plan field {name!r} is {v}, above the limit of {most} "
                                f"(meshplan.plan.MAX_{name.upper()})")
        if not isinstance(self.annotations, Mapping):
            raise PlanError("plan field 'annotations' must be a mapping value name -> placements")
        if self.search is not None and not isinstance(self.search, Mapping):
            raise PlanError(f"plan field 'search' must be a mapping (what the search knew of the "
                            f"plan) or null, got {type(self.search).__name__}")
        if self.annotations:  # the same placement checks as Strategy.annotation
            try:
                self.strategy.replace(annotation=dict(self.annotations))
            except StrategyError as e:
                raise PlanError(f"plan field 'annotations': {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``version`` and every field (``search`` only when set);
        :meth:`from_dict` reads it back."""
        d = {
            "version": PLAN_VERSION,
            "model": self.model,
            "cluster": self.cluster,
            "nodes": self.nodes,
            "seq_len": self.seq_len,
            "num_layers": self.num_layers,
            "strategy": self.strategy.to_dict(),
            "annotations": {k: list(v) for k, v in self.annotations.items()},
        }
        if self.search is not None:
            d["search"] = dict(self.search)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict`` as JSON text (sorted keys; ``indent`` as ``json.dumps``)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`. Raises PlanError naming a missing/unknown field."""
        if not isinstance(data, Mapping):
            raise PlanError(f"a plan must be a JSON object, got {type(data).__name__}")
        known = {"version", "model", "cluster", "nodes", "seq_len", "num_layers", "strategy",
                 "annotations", "search"}
        extra = sorted(set(data) - known)
        if extra:
            raise PlanError(f"unknown plan field(s) {extra}")
        for req in ("model", "cluster", "strategy"):
            if req not in data:
                raise PlanError(f"plan is missing field {req!r}")
        version = data.get("version", PLAN_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
            raise PlanError(f"plan field 'version' is {data['version']!r}; this meshplan reads "
                            f"versions {list(READABLE_VERSIONS)}")
        try:
            strategy = Strategy.from_dict(data["strategy"])
        except StrategyError as e:
            raise PlanError(f"plan field 'strategy': {e}") from None
        return cls(model=data["model"], cluster=data["cluster"], strategy=strategy,
                   nodes=data.get("nodes"), seq_len=data.get("seq_len"),
                   num_layers=data.get("num_layers"), annotations=_annotations(data),
                   search=data.get("search"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Parse plan JSON text. Raises PlanError naming the line/column of bad JSON, a
        document nested deeper than :data:`MAX_JSON_DEPTH`, a number JSON cannot hold
        (an integer of more than 4300 digits), or the bad field."""
        if not isinstance(text, str):
            raise PlanError(f"plan JSON must be text, got {type(text).__name__}")
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise PlanError(f"plan JSON is nested {depth} levels deep; a plan has at most "
                            f"{MAX_JSON_DEPTH} (meshplan.plan.MAX_JSON_DEPTH)")
        try:
            data = json.loads(text, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan JSON line {e.lineno} column {e.colno}: {e.msg}") from None
        except (ValueError, RecursionError) as e:  # an over-long integer, nesting
            raise PlanError(f"plan JSON: {str(e).split(';')[0]}") from None
        if isinstance(data, Mapping) and "version" not in data:  # the spellings differ by version
            import warnings

            warnings.warn(f"the plan has no 'version' field: read as version {PLAN_VERSION} (this "
                          f"meshplan's; version 1 spelled mp, schedule_mode and sharding_stage); "
                          f"add \"version\": {PLAN_VERSION}", UserWarning, stacklevel=2)
        return cls.from_dict(data)

    def on(self, cluster: str | None = None, nodes: int | None = None) -> Plan:
        """This plan on another ``cluster`` and / or node count (None: the plan's own), as
        ``meshplan cost PLAN.json --cluster`` and ``export PLAN.json --cluster`` move it."""
        return replace(self, cluster=self.cluster if cluster is None else cluster,
                       nodes=self.nodes if nodes is None else nodes)

    def save(self, path: str | Path) -> Path:
        """Write the plan's JSON to ``path``; returns the path. A model or cluster given as a
        relative file path (from the working directory) is written relative to the plan
        file's folder, so that :meth:`load` finds it from any working directory (a plan
        that ``tune`` writes into its run folder names the ``config.json`` it was given).
        Raises OSError when it cannot be written."""
        p = Path(path)
        plan = replace(self, model=_from_plan_dir(self.model, p), cluster=_from_plan_dir(self.cluster, p))
        p.write_text(plan.to_json() + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan written by :meth:`save` (``path`` may be the folder holding it as
        ``plan.json``: tune's ``--output``). Raises FileNotFoundError when the file is
        absent, PlanError (naming the file) on bad content: not UTF-8, larger than
        :data:`MAX_PLAN_BYTES`, bad JSON or a bad field."""
        p = Path(path)
        if p.is_dir() and (p / "plan.json").is_file():  # tune's --output folder
            p = p / "plan.json"
        if p.is_dir():
            raise InputFileNotFoundError(f"plan file not found: {p} is a folder without a plan.json")
        if not p.is_file():
            raise InputFileNotFoundError(f"plan file not found: {p}")
        if p.stat().st_size > MAX_PLAN_BYTES:
            raise PlanError(f"{p}: {p.stat().st_size} bytes, larger than a plan can be "
                            f"({MAX_PLAN_BYTES}, meshplan.plan.MAX_PLAN_BYTES)")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"{p}: not UTF-8 text (byte {e.start})") from None
        try:
            plan = cls.from_json(text)
        except PlanError as e:
            raise PlanError(f"{p}: {e}") from None
        return replace(plan, model=_beside(plan.model, p), cluster=_beside(plan.cluster, p))


def _model_folder(ref: str) -> bool:
    """Whether ``ref`` names a Hugging Face model folder (a directory holding a
    ``config.json``) rather than a built-in model (a catalog name wins, as it does in
    ``completion.get_model_config``)."""
    from completion.models.catalog import catalog_name

    return catalog_name(ref) is None and (Path(ref) / "config.json").is_file()


def _from_plan_dir(ref: str, plan_path: Path) -> str:
    """``ref`` as :meth:`Plan.save` writes it: a relative file path that exists from the
    working directory, or a model folder, relative to the plan file's folder (a folder
    with a trailing ``/``, which marks it a path when the plan is read); anything else
    as written."""
    if not ref.endswith(_FILE_SUFFIXES) and not ref.endswith("/") and _model_folder(ref):
        if Path(ref).is_absolute():
            return ref
        return os.path.relpath(os.path.abspath(ref), os.path.abspath(plan_path.parent)) + "/"
    if not ref.endswith((*_FILE_SUFFIXES, "/")) or Path(ref).is_absolute() or not Path(ref).exists():
        return ref
    # absolute paths without following links: a Hugging Face snapshot's config.json is a
    # link to a blob without a .json name, and the link's own name is what reads as a file
    return os.path.relpath(os.path.abspath(ref), os.path.abspath(plan_path.parent))


def _beside(ref: str, plan_path: Path) -> str:
    """A plan's model or cluster reference as the caller can open it: a relative file path
    is taken from the plan file's folder when it exists there (:meth:`Plan.save` writes it
    so; a plan and its config.json travel together), else as written (a plan written by
    hand with a path from the working directory); names and absolute paths are kept."""
    if not ref.endswith((*_FILE_SUFFIXES, "/")) or Path(ref).is_absolute():
        return ref
    for folder in (plan_path.parent, plan_path.resolve().parent):  # as named, then a link's target
        near = folder / ref
        if near.exists():
            return str(near)
    return ref


#: suffixes of the model and cluster references that are files, not catalog names
_FILE_SUFFIXES = (".json", ".yaml", ".yml", ".pir", ".txt")
