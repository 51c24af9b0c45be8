"""An export re-costed as the target framework will run it: the exported file read back by
the same reader ``meshplan cost`` uses to import that framework's files
(:func:`~meshplan.frameworks.megatron.strategy_from_args`,
:func:`~meshplan.frameworks.torchtitan.strategy_from_toml`,
:func:`~meshplan.frameworks.deepspeed.strategy_from_config`), costed by the Engine under
that framework's profile, beside the tuned plan's own prediction.

What the file does not carry comes from the plan, as the user would give it when importing:
the GPUs (the exported job's world: dp x tp x pp x cp as the target runs it) and the model
(its decoder layers, sequence length; Megatron-LM's MoE arguments are checked against it,
as ``meshplan cost`` checks them); for DeepSpeed also what its training script sets (pp for
the ``PipelineModule``, the checkpoint calls' recompute, the schedule it runs). The profile:
the plan's own when it is one of the target's (:data:`FAMILIES`), else the first of the
target's that reads the file (``megatron-core`` unless the file asks for what only
``megatron-bridge`` runs, e.g. ``--grad-reduce-in-bf16``; torchtitan's comes from its
``[compile]`` section).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.frameworks.deepspeed import export as deepspeed_export
from meshplan.frameworks.megatron import export as megatron_export
from meshplan.frameworks.torchtitan import export as torchtitan_export

#: target -> the framework profiles that are its, as its exporter names them (the first:
#: what a plan of another profile is re-costed with)
FAMILIES: dict[str, tuple[str, ...]] = {
    "megatron": megatron_export.FAMILIES, "torchtitan": torchtitan_export.FAMILIES,
    "deepspeed": deepspeed_export.FAMILIES}
#: Strategy fields compared between the tuned plan and the re-imported job, with the words a
#: warning names them by
COMPARED = {"dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "vpp": "vpp",
            "etp": "expert tensor parallelism",
            "schedule": "schedule", "micro_batch_size": "micro-batch", "global_batch_size": "global batch",
            "recompute": "recompute", "zero": "ZeRO stage", "fsdp_shard_size": "HSDP shard group",
            "sequence_parallel": "sequence parallelism", "dtype": "dtype", "fp8": "FP8 recipe",
            "optimizer": "optimizer", "layers_per_stage": "layer split", "framework": "framework profile",
            "cp_comm": "cp exchange"}
#: relative step or peak difference over which the export warns
WARN_OVER = 0.05


@dataclass
class Recost:
    """The tuned plan's prediction and the exported job's, under the target's profile.

    Attributes:
        target: the export target.
        strategy: the Strategy the target's reader makes of the exported file.
        step_s, peak_bytes: the exported job's predicted step (seconds) and peak memory of
            its heaviest rank (bytes).
        tuned_step_s, tuned_peak_bytes: the tuned plan's.
        limit_bytes: the device's memory limit at the default headroom (bytes).
        changed: the :data:`COMPARED` fields whose value differs, as ``"ZeRO stage 2 -> 1"``.
        reader_notes: what the reader noted while importing.
        moved: the names of those fields (:func:`moved_fields`, the layer split compared as
            each side was costed).
    """

    target: str
    strategy: Any
    step_s: float
    peak_bytes: float
    tuned_step_s: float
    tuned_peak_bytes: float
    limit_bytes: float
    changed: list[str] = field(default_factory=list)
    reader_notes: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Whether the exported job's peak is within the device's limit."""
        return self.peak_bytes <= self.limit_bytes

    @property
    def step_change(self) -> float:
        """(exported - tuned) / tuned step time."""
        return self.step_s / self.tuned_step_s - 1

    @property
    def peak_change(self) -> float:
        """(exported - tuned) / tuned peak memory."""
        return self.peak_bytes / self.tuned_peak_bytes - 1

    def line(self) -> str:
        """``re-costed as <target> runs it (<profile>): step X ms, peak Y GiB; the tuned plan:
        ...`` (one line)."""
        return (f"re-costed as {self.target} runs it ({self.strategy.framework} profile, the file read "
                f"back as `meshplan cost` imports it): step {self.step_s * 1e3:.1f} ms, peak "
                f"{self.peak_bytes / 2**30:.2f} GiB of {self.limit_bytes / 2**30:.2f}; the tuned plan: "
                f"{self.tuned_step_s * 1e3:.1f} ms, {self.tuned_peak_bytes / 2**30:.2f} GiB")

    def warning(self) -> str | None:
        """A line when the step or the peak moved by more than :data:`WARN_OVER`, naming what
        changed; None otherwise."""
        if abs(self.step_change) <= WARN_OVER and abs(self.peak_change) <= WARN_OVER:
            return None
        what = "; ".join(self.changed) or "no knob (the profile's kernels and overlap)"
        return (f"the exported job is predicted at {self.step_change:+.1%} step time and "
                f"{self.peak_change:+.1%} peak memory against the tuned plan: {what}")


def _argv(text: str) -> list[str]:
    """The arguments of a Megatron-LM export (``#`` comment lines dropped, continuations joined)."""
    return shlex.split(" ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.startswith("#")))


def _profiles(plan: Any, target: str) -> tuple[str, ...]:
    """The profiles to read the file with, in order: the plan's own when it is one of the
    target's, then the target's others."""
    fw = plan.strategy.framework
    return (fw,) + tuple(f for f in FAMILIES[target] if f != fw) if fw in FAMILIES[target] else FAMILIES[target]


def _moe_split(argv: list[str]) -> tuple[list[str], Any]:
    """(the arguments without Megatron-LM's MoE ones, those as a ``MegatronMoE``): the MoE
    arguments describe the model and are checked against it, as ``meshplan cost`` does."""
    from dataclasses import fields

    from meshplan.frameworks.megatron.moe import MegatronMoE

    names = {"--" + f.name.replace("_", "-"): f for f in fields(MegatronMoE)}
    kept: list[str] = []
    got: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        f = names.get(argv[i])
        if f is None:
            kept.append(argv[i])
        elif f.type in (bool, "bool"):
            got[f.name] = True
        else:
            got[f.name], i = argv[i + 1], i + 1
        i += 1
    for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
        if k in got:
            got[k] = int(got[k])
    if "moe_aux_loss_coeff" in got:
        got["moe_aux_loss_coeff"] = float(got["moe_aux_loss_coeff"])
    return kept, MegatronMoE(**got)


def _megatron(plan: Any, out: Any, world: int) -> tuple[Any, list[str]]:
    from meshplan.frameworks.megatron import moe, strategy_from_args
    from meshplan.frameworks.targets import model_config, model_sizes

    argv, moe_args = _moe_split(_argv(out.text))
    notes: list[str] = []
    cfg = model_config(plan)
    if moe_args.given() and cfg is not None:
        notes += moe.check(moe_args, cfg, model_sizes(plan)[0] or cfg.num_layers)
    err: MeshplanError | None = None
    for fw in _profiles(plan, "megatron"):  # e.g. --grad-reduce-in-bf16: a profile that runs it
        try:
            strategy, more = strategy_from_args(argv, world, model=plan.model, framework=fw)
            return strategy, notes + more
        except MeshplanError as e:
            err = err or e
    assert err is not None
    raise err


def _torchtitan(plan: Any, out: Any, world: int) -> tuple[Any, list[str]]:
    from meshplan.frameworks.targets import model_sizes
    from meshplan.frameworks.torchtitan import strategy_from_toml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.toml"
        path.write_text(out.text)
        try:
            strategy, _, notes = strategy_from_toml(path, world, model_sizes(plan)[0])
        except MeshplanError as e:  # the temporary file's name says nothing to the user
            raise MeshplanError(str(e).replace(f"{path}: ", "the exported TOML: ").replace(str(path), "the exported TOML"),
                                field=getattr(e, "field", None)) from None
    return strategy, notes


def _deepspeed(plan: Any, out: Any, world: int) -> tuple[Any, list[str]]:
    from meshplan.frameworks.deepspeed import strategy_from_config

    eff = out.effective
    script = {"schedule": eff["schedule"], "vpp": eff["vpp"], "ep": eff["ep"]}
    if eff["attention"] is not None:
        script["attention"] = eff["attention"]
    if eff["layers_per_stage"] is not None and eff["pp"] > 1:
        script["layers_per_stage"] = tuple(eff["layers_per_stage"])
    return strategy_from_config(json.loads(out.text), world, pp=eff["pp"], recompute=eff["recompute"],
                                sequence_parallel=bool(eff["sequence_parallel"]),
                                framework=_profiles(plan, "deepspeed")[0], **script)


#: target -> its reader of an exported file: (plan, Export, world) -> (Strategy, notes)
READERS: dict[str, Callable[[Any, Any, int], tuple[Any, list[str]]]] = {
    "megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed}


def moved_fields(tuned: Any, exported: Any, splits: tuple[Any, Any] | None = None) -> list[str]:
    """The :data:`COMPARED` fields whose value differs between two Strategies (a ZeRO stage
    over one data-parallel rank shards nothing either way; etp None is tp, and without expert
    parallelism on either side etp splits no experts, ep naming the change). A layer split one
    of them leaves to the framework (None) is compared as costed when ``splits`` gives the
    split each one's costing ran (the Engine's ``StepResult.layers_per_vstage``: the cost
    model balances the stages of a None split, e.g. [7, 5, 6, 6], where the file may list an
    even one), else not compared."""
    return [f for f, _ in _moved(tuned, exported, splits)]


def _moved(tuned: Any, exported: Any, splits: tuple[Any, Any] | None) -> list[tuple[str, tuple[Any, Any]]]:
    """(field, (tuned value, exported value)) of each :func:`moved_fields` field, in
    :data:`COMPARED` order, the values as compared."""
    out = []
    for f in COMPARED:
        a, b = _value(tuned, f), _value(exported, f)
        if f == "layers_per_stage" and None in (a, b):
            if splits is None:
                continue
            a, b = (tuple(x) for x in splits)
        if (f == "zero" and tuned.dp == exported.dp == 1) or (f == "etp" and 1 in (tuned.ep, exported.ep)):
            continue
        if a != b:
            out.append((f, (a, b)))
    return out


def _value(s: Any, f: str) -> Any:
    """Strategy field ``f`` of ``s``, etp None read as tp (Megatron-Core's default) and a
    layer split as a tuple."""
    v = getattr(s, f)
    if f == "etp" and v is None:
        return s.tp
    return tuple(v) if f == "layers_per_stage" and v is not None else v


def changed_fields(tuned: Any, exported: Any, splits: tuple[Any, Any] | None = None) -> list[str]:
    """``"<name> <tuned> -> <exported>"`` for each of :func:`moved_fields` (the layer split
    as costed where a side leaves it to the framework, ``splits``)."""
    word = {True: "on", False: "off", None: "none"}

    def say(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return list(v)
        return word[v] if isinstance(v, bool) or v is None else v

    return [f"{COMPARED[f]} {say(a)} -> {say(b)}" for f, (a, b) in _moved(tuned, exported, splits)]


def recost(plan: Any, out: Any) -> Recost:
    """Re-cost ``out`` (the :class:`~meshplan.frameworks.targets.Export` of ``plan``) as its
    target runs it (module docstring).

    Raises:
        MeshplanError: the target's reader refuses the exported file, or the Engine refuses
            the job it reads (the message names the target and the reason): the export
            cannot be re-costed.
    """
    from clusters.spec import DEFAULT_MEMORY_HEADROOM
    from meshplan.engine import Engine

    eff = out.effective
    world = eff["dp"] * eff["tp"] * eff["pp"] * eff["cp"]
    tuned_engine = Engine.from_plan(plan, None)
    tuned = tuned_engine.step_model().run()
    try:
        strategy, notes = READERS[out.target](plan, out, world)
        engine = Engine(plan.model, plan.cluster, strategy, nodes=plan.nodes, seq_len=plan.seq_len,
                        num_layers=plan.num_layers)
        res = engine.step_model().run()
    except (MeshplanError, ValueError) as e:
        raise MeshplanError(f"the {out.target} export cannot be re-costed as {out.target} reads it: {e}",
                            field="target") from None
    splits = (tuple(tuned.layers_per_vstage), tuple(res.layers_per_vstage))
    return Recost(out.target, strategy, res.step_time, res.max_memory_bytes, tuned.step_time,
                  tuned.max_memory_bytes, engine.cluster.device.memory_limit(DEFAULT_MEMORY_HEADROOM),
                  changed_fields(plan.strategy, strategy, splits), notes,
                  moved_fields(plan.strategy, strategy, splits))


__all__ = ["COMPARED", "FAMILIES", "READERS", "WARN_OVER", "Recost", "changed_fields", "moved_fields", "recost"]


def recost_notes(plan: Any, out: Any, force: bool) -> tuple[str | None, str | None]:
    """``(note, warning)`` of the exported job re-costed as its target runs it
    (``meshplan.frameworks.recost``): the note gives its step and peak beside the tuned
    plan's; the warning names what changed when either moved by more than 5%, or says why
    the file could not be re-costed. Raises MeshplanError when the exported job does not fit
    in the device's memory, unless ``force``."""
    try:
        r = recost(plan, out)
    except MeshplanError as e:
        return None, f"not re-costed: {e}"
    if not r.fits and not force:
        what = f" ({'; '.join(r.changed)})" if r.changed else ""
        raise MeshplanError(f"the exported job does not fit as {out.target} runs it{what}: peak "
                            f"{r.peak_bytes / 2**30:.2f} GiB of the {r.limit_bytes / 2**30:.2f} GiB limit "
                            f"(the tuned plan: {r.tuned_peak_bytes / 2**30:.2f} GiB); --force writes it "
                            "anyway", field="target")
    return r.line(), r.warning()


def model_source(plan: Any) -> Any:
    """The ModelSource of ``plan``'s model, its warnings already shown by the costing."""
    import warnings

    from completion.models.source import resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_model(plan.model, plan.seq_len)


def costed_plan(plan: Any, pin: bool = False, target: str | None = None) -> tuple[Any, str | None]:
    """``plan`` after every check ``meshplan cost`` runs on it (the model's heads, layers and
    sequence against tp / pp / vpp / cp, the world against the cluster's GPUs ...; the
    errors of ``Engine.from_plan`` and the step model, naming the field at fault), with the
    pipeline layer split the cost model used when the plan fixes none and the layers do not
    divide over the virtual stages (``meshplan.validation.predicted_plan``; Megatron-LM's
    ``get_num_layers_to_build`` refuses that without a layout): what is exported or
    launched is what was costed, never a layout the framework would refuse at start-up.
    Where the layers divide, Megatron-LM's arguments split them evenly while the cost model
    balances the stages' time (e.g. [5, 3] for 8 layers on pp 2 beside the embedding and
    loss): the plan keeps the even split and the note gives both splits' step time and
    peak, the even one costed again (``--layers-per-stage`` pins either). A target whose
    file lists every stage's layers anyway (``targets.LISTS_EVERY_SPLIT``: torchtitan's
    module lists) gets the cost model's split pinned, as tuned: the exported job re-costs
    as the tuned plan. A split the plan pins is exported as it was costed, without a note;
    so is the cost model's own split with ``pin`` (``--layers-per-stage balanced``).
    ``target``: the export target (DeepSpeed runs no even split of its own).
    Returns ``(plan, note)``: the note (None when there is nothing to say) also says that
    the costed peak memory is over the device's limit with the default headroom, as
    ``cost`` prints OUT OF MEMORY."""
    from clusters.spec import DEFAULT_MEMORY_HEADROOM
    from meshplan.engine import Engine
    from meshplan.frameworks.targets import LISTS_EVERY_SPLIT
    from meshplan.validation import predicted_plan
    from simulator.layer_split import even_split

    engine = Engine.from_plan(plan, None)
    res = engine.step_model().run()
    split = list(res.layers_per_vstage)
    notes = []
    if plan.strategy.layers_per_stage is not None:  # pinned: exported as costed
        pass
    elif pin or sum(split) % len(split) != 0 or (target in LISTS_EVERY_SPLIT and len(split) > 1):
        # asked for, the framework needs it stated, or its file lists every split anyway
        plan = predicted_plan(plan, {"layers_per_vstage": split})
    elif len(set(split)) > 1:  # the framework's own even split runs: cost it too, say both
        even = list(even_split(sum(split), len(split)))
        other = Engine.from_plan(_with_split(plan, even), None).step_model().run()
        runs = ("DeepSpeed partitions the layers its own way (its note); the even split "
                f"{even}" if target == "deepspeed" else
                f"the framework splits the layers evenly, {even}, as exported")
        notes.append(f"layers_per_stage: the cost model balanced the stages as {split} "
                     f"({res.step_time * 1e3:.1f} ms a step, peak {res.max_memory_bytes / 2**30:.2f} "
                     f"GiB); {runs}: "
                     f"{other.step_time * 1e3:.1f} ms, peak {other.max_memory_bytes / 2**30:.2f} GiB "
                     f"(--layers-per-stage balanced exports the balanced one)")
        res = other
    limit = engine.cluster.device.memory_limit(DEFAULT_MEMORY_HEADROOM)
    if res.max_memory_bytes > limit:
        notes.append(f"OUT OF MEMORY as costed: the plan needs {res.max_memory_bytes / 2**30:.2f} GiB of "
                     f"the {limit / 2**30:.2f} GiB limit (meshplan cost shows the breakdown)")
    return plan, "; ".join(notes) or None


def as_run_note(plan: Any, eff: dict[str, Any], target: str) -> str | None:
    """A note with the step time and peak memory of ``plan`` as ``target`` runs it, when the
    exporter changed its pipeline schedule or chunks per rank (``eff``: the exported layout,
    ``Export.effective``; e.g. Megatron-LM runs a ZBVPP plan as interleaved 1F1B, DeepSpeed one
    chunk per rank): the plan's own figures would be the prediction of a run that does not
    happen. The exported layer split is kept where it has pp x vpp entries, else the
    framework's even split is costed. The note says OUT OF MEMORY when that run is over the
    device's limit (the default headroom, as ``costed_plan``), and says why when the
    framework cannot run the plan that way at all (the cost model refuses it: e.g. an
    interleaved schedule whose micro-batches are no multiple of pp). None when the schedule
    is the plan's."""
    from clusters.spec import DEFAULT_MEMORY_HEADROOM
    from meshplan.engine import Engine
    from meshplan.frameworks.targets import model_sizes
    from simulator.layer_split import even_split

    s = plan.strategy
    sched, vpp = eff.get("schedule", s.schedule), eff.get("vpp", s.vpp)
    if (sched, vpp) == (s.schedule, s.vpp):
        return None
    lps = eff.get("layers_per_stage", s.layers_per_stage)
    layers = sum(s.layers_per_stage) if s.layers_per_stage else model_sizes(plan)[0]
    if lps is None or len(lps) != s.pp * vpp:
        lps = (even_split(layers, s.pp * vpp) if layers is not None and s.pp * vpp > 1
               and layers % (s.pp * vpp) == 0 else None)
    name = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}.get(target, target)
    chunks = f" with {vpp} chunk(s) per rank" if vpp != s.vpp else ""
    engine = Engine.from_plan(plan, None)
    own = engine.step_model().run()
    mine = (f"the plan's {s.schedule}{f' (vpp {s.vpp})' if chunks else ''}: "
            f"{own.step_time * 1e3:.1f} ms, peak {own.max_memory_bytes / 2**30:.2f} GiB")
    try:
        ran = dataclasses.replace(plan, strategy=s.replace(schedule=sched, vpp=vpp,
                                                           layers_per_stage=lps and tuple(lps)))
        run = Engine.from_plan(ran, None).step_model().run()
    except ValueError as e:  # the framework's version of the plan is not a plan
        return (f"schedule: {name} cannot run this plan as {sched}{chunks}: "
                f"{' '.join(str(e).split())}; {mine}")
    limit = engine.cluster.device.memory_limit(DEFAULT_MEMORY_HEADROOM)
    oom = (f" -- OUT OF MEMORY ({limit / 2**30:.2f} GiB limit)" if run.max_memory_bytes > limit
           else "")
    return (f"schedule: as {name} runs it ({sched}{chunks}): {run.step_time * 1e3:.1f} ms a step, "
            f"peak {run.max_memory_bytes / 2**30:.2f} GiB{oom} (under the plan's {s.framework} "
            f"profile); {mine}")


def _with_split(plan: Any, split: list[int]) -> Any:
    """``plan`` with its strategy's layer split set to ``split``."""
    return dataclasses.replace(plan, strategy=plan.strategy.replace(layers_per_stage=tuple(split)))
