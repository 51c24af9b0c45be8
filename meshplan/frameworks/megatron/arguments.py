"""Megatron-LM arguments that ``meshplan cost``, ``tune`` and ``export`` take besides the
one-to-one aliases of :data:`meshplan.flags.FLAGS`: each is translated into
Strategy fields as Megatron-LM itself derives them (``megatron/training/arguments.py`` and
``megatron/core/transformer/transformer_config.py`` at NVIDIA/Megatron-LM d98e8a6):

- ``--num-layers-per-virtual-pipeline-stage N``: decoder layers per model chunk, so
  ``vpp = (layers / pp) / N`` (``validate_args``: the layers must divide by pp, and the
  layers per stage by N); Megatron then runs interleaved 1F1B, so the schedule becomes
  ``VPP`` unless ``--schedule`` is given. ``--num-virtual-stages-per-pipeline-rank`` is
  ``--vpp`` itself; both switch the schedule the same way (the default 1F1B runs one chunk
  per rank), except in ``tune``, where ``--vpp`` pins the knob and the schedule stays
  searched.
- ``--recompute-granularity full|selective`` with ``--recompute-method uniform|block`` and
  ``--recompute-num-layers N`` (``TransformerConfig.recompute_*``): ``selective`` (no
  method, no N) is meshplan's ``selective`` (the core attention, Korthikanti et al. 2022);
  ``full`` needs a method, as in Megatron; ``uniform`` with N = 1 (the default here) keeps
  every layer's input and recomputes the layer: meshplan's ``full``; ``block`` with N at
  least the layers of a model chunk recomputes every layer, the same. Recompute units of
  N > 1 layers (uniform) and only the first N layers of a chunk (block, N smaller) are not
  modelled and are refused, naming the flag. ``--recompute-activations`` is
  ``--recompute-granularity selective`` (``validate_args``).
- ``--use-distributed-optimizer``: optimizer states sharded over dp, ZeRO stage 1
  (``--zero 1``; the inverse of ``meshplan export --to megatron``).
- ``--bf16`` / ``--fp16``: ``--dtype bfloat16`` / ``float16``; ``--fp8-format hybrid|e4m3``
  with ``--fp8-recipe delayed|tensorwise`` (Megatron's default recipe: delayed): the
  decoder linears in FP8 under BF16, ``--dtype fp8-delayed`` (tensorwise, Transformer
  Engine's current scaling, is costed as delayed scaling, with a note; both formats store
  1 byte an element: the same cost); ``--fp8-amax-history-len`` and
  ``--fp8-amax-compute-algo`` are taken and do not change the cost (the model keeps
  NeMo's 1024-step history). ``--optimizer adam`` is Adam with decoupled weight decay,
  meshplan's ``adamw`` (``megatron/core/optimizer``: torch/apex AdamW under that name);
  ``sgd`` is ``sgd``. What ``meshplan export --to megatron`` writes reads back.

Each contradiction (``--recompute full --recompute-granularity selective``,
``--zero 2 --use-distributed-optimizer``, ``--vpp 2`` with
``--num-layers-per-virtual-pipeline-stage``) is a :class:`MeshplanError` naming both flags as
typed (``field`` set to the Megatron-LM argument at fault). Nothing here imports a
command-line library: the flags a user typed come in as :class:`~meshplan.frameworks.given.GivenFlags`;
the CLI declares the options once (``meshplan.commands.megatron_options``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.frameworks.given import GivenFlags

#: the Megatron-only options of this module as they are spelled
MEGATRON_FLAGS = ("--num-layers-per-virtual-pipeline-stage", "--recompute-granularity",
                  "--recompute-method", "--recompute-num-layers", "--recompute-activations",
                  "--use-distributed-optimizer", "--bf16", "--fp16", "--fp8-format", "--fp8-recipe",
                  "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--optimizer",
                  "--pipeline-model-parallel-layout", "--use-megatron-fsdp",
                  "--data-parallel-sharding-strategy", "--num-distributed-optimizer-instances",
                  "--outer-dp-sharding-strategy", "--grad-reduce-in-bf16", "--overlap-grad-reduce",
                  "--overlap-param-gather", "--tp-comm-overlap")


class Fp8Format(str, Enum):
    """Megatron-LM ``--fp8-format``."""

    hybrid = "hybrid"
    e4m3 = "e4m3"


class Fp8Recipe(str, Enum):
    """Megatron-LM ``--fp8-recipe`` (the ones meshplan models)."""

    delayed = "delayed"
    tensorwise = "tensorwise"


class MegatronOptimizer(str, Enum):
    """Megatron-LM ``--optimizer`` (``adam`` is AdamW there)."""

    adam = "adam"
    sgd = "sgd"


#: Megatron ``--fp8-recipe`` -> meshplan's ``--dtype`` spelling of that FP8 recipe: Megatron's
#: tensorwise is Transformer Engine's per-tensor current scaling, costed as delayed scaling
#: (its amax pass before each cast is not costed: the approximation the measured
#: Megatron-Bridge rows state, ``experiments.measured_cells.FP8_PRECISIONS``); meshplan's
#: own ``fp8-tensorwise`` is torchao's, under the fsdp2 profiles
FP8_RECIPE_DTYPES = {"delayed": "fp8-delayed", "tensorwise": "fp8-delayed"}
#: Megatron ``--optimizer`` -> ``Strategy.optimizer``
OPTIMIZERS = {"adam": "adamw", "sgd": "sgd"}


class Granularity(str, Enum):
    """Megatron-LM ``--recompute-granularity``."""

    full = "full"
    selective = "selective"


class Method(str, Enum):
    """Megatron-LM ``--recompute-method``."""

    uniform = "uniform"
    block = "block"


class DpSharding(str, Enum):
    """``--data-parallel-sharding-strategy`` (Megatron-FSDP, arguments.py) -> a ZeRO stage."""

    no_shard = "no_shard"
    optim = "optim"
    optim_grads = "optim_grads"
    optim_grads_params = "optim_grads_params"


#: Megatron-FSDP's sharding strategy -> ZeRO stage (docs/user-guide/features/megatron_fsdp.md)
FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


@dataclass(frozen=True)
class MegatronArgs:
    """The Megatron-only arguments of one command line (None / False: not given)."""

    vpp_layers: int | None = None
    granularity: Any = None
    method: Any = None
    recompute_layers: int | None = None
    recompute_activations: bool = False
    distributed_optimizer: bool = False
    bf16: bool = False
    fp16: bool = False
    fp8_format: Any = None
    fp8_recipe: Any = None
    fp8_amax_algo: str | None = None
    optimizer: Any = None
    pipeline_layout: str | None = None
    megatron_fsdp: bool = False
    dp_sharding: Any = None
    optimizer_instances: int | None = None
    outer_sharding: str | None = None
    grad_reduce_bf16: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False

    #: the command parameter (the CLI function's argument) of each field
    PARAMS = {"vpp_layers": "vpp_layers", "granularity": "recompute_granularity",
              "method": "recompute_method", "recompute_layers": "recompute_num_layers",
              "recompute_activations": "recompute_activations",
              "distributed_optimizer": "use_distributed_optimizer", "bf16": "bf16", "fp16": "fp16",
              "fp8_format": "fp8_format", "fp8_recipe": "fp8_recipe",
              "fp8_amax_algo": "fp8_amax_compute_algo", "optimizer": "megatron_optimizer",
              "pipeline_layout": "pipeline_model_parallel_layout",
              "megatron_fsdp": "use_megatron_fsdp", "dp_sharding": "data_parallel_sharding_strategy",
              "optimizer_instances": "num_distributed_optimizer_instances",
              "outer_sharding": "outer_dp_sharding_strategy", "grad_reduce_bf16": "grad_reduce_in_bf16",
              "overlap_grad_reduce": "overlap_grad_reduce", "overlap_param_gather": "overlap_param_gather",
              "tp_comm_overlap": "tp_comm_overlap"}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> MegatronArgs:
        """The Megatron arguments of a command's parameters (its ``locals()``: the names of
        :attr:`PARAMS`, e.g. ``meshplan.commands.megatron_options.VPP_LAYERS``); one the
        command does not offer keeps its default (``tune`` has no
        ``--pipeline-model-parallel-layout``)."""
        return cls(**{f: params[p] for f, p in cls.PARAMS.items() if p in params})

    def needs_layers(self) -> bool:
        """True when translating needs the model's decoder layer count."""
        return self.vpp_layers is not None or _value(self.method) == "block"


def _expand_layout(text: str) -> str:
    """A pipeline layout with its repetitions written out: ``(X)*n`` and ``c*n`` (one
    symbol) repeated, commas and spaces dropped. Raises MeshplanError naming the argument."""
    flag = "--pipeline-model-parallel-layout"
    def rep(part: str, n: str) -> str:
        if len(part) * int(n) > 1 << 16:
            raise MeshplanError(f"{flag} {text!r}: more than {1 << 16} layers", field=flag)
        return part * int(n)

    t = re.sub(r"[\s,]", "", text)
    if re.search(r"\([^)]*\(", t):  # Megatron-LM's parse_str_to_list takes one level
        raise MeshplanError(f"{flag} {text!r}: nested (...) groups are not Megatron-LM's grammar", field=flag)
    t = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: rep(m.group(1), m.group(2)), t)
    t = re.sub(r"\(([^()]*)\)", r"\1", t)
    t = re.sub(r"([A-Za-z])\*(\d+)", lambda m: rep(m.group(1), m.group(2)), t)
    if not re.fullmatch(r"[A-Za-z|]*", t) or len(t) > 1 << 16:
        raise MeshplanError(f"{flag} {text!r}: not a layout of E, t, L and | (with *N repeats "
                            "and (...) groups), e.g. 'E,t*4|t*4,L'", field=flag)
    return t


def layout_split(text: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage, in model order, of a Megatron-LM
    ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout`` grammar: ``E`` the
    embedding, ``t`` a decoder layer, ``L`` the loss, ``|`` between virtual stages, ``t*n``
    and ``(...)*n`` repeats): ``'E,t*4|t*4,L'`` -> (4, 4). meshplan places the embedding on
    the first stage and the loss on the last, so E and L elsewhere, and symbols it does not
    model (``m``, a multi-token-prediction layer), are refused; MeshplanError naming the
    argument."""
    flag = "--pipeline-model-parallel-layout"
    stages = _expand_layout(text).split("|")
    for i, st in enumerate(stages):
        bad = sorted(set(st) - {"E", "t", "L"})
        if bad:
            raise MeshplanError(f"{flag} {text!r}: meshplan models E (embedding), t (decoder "
                                f"layer) and L (loss); stage {i} has {''.join(bad)}", field=flag)
        if ("E" in st) != (i == 0) or st.count("E") > 1 or (i == 0 and not st.startswith("E")):
            raise MeshplanError(f"{flag} {text!r}: the embedding E must open the first stage "
                                "(where meshplan places it), once", field=flag)
        if ("L" in st) != (i == len(stages) - 1) or st.count("L") > 1 or \
                (i == len(stages) - 1 and not st.endswith("L")):
            raise MeshplanError(f"{flag} {text!r}: the loss L must close the last stage (where "
                                "meshplan places it), once", field=flag)
    return tuple(st.count("t") for st in stages)


#: how errors name a knob's flag when the user did not type it
FLAG_NAMES = {"pp": "--pp/--pipeline-model-parallel-size",
              "vpp": "--vpp/--num-virtual-stages-per-pipeline-rank"}


def _value(choice: Any) -> Any:
    """The plain value of an Enum choice (``Fp8Recipe.delayed`` -> ``"delayed"``); others as is."""
    return choice.value if isinstance(choice, Enum) else choice


def _conflict(cl: GivenFlags, field: str, ours: str, why: str) -> MeshplanError:
    return MeshplanError(f"{cl.flag(field)} and {ours}: {why}; give one of them", field=ours.split()[0])


def _recompute(cl: GivenFlags, m: MegatronArgs, layers_per_chunk: Callable[[], int]) -> str | None:
    """meshplan's recompute for the Megatron recompute arguments (None: none given)."""
    gran = _value(m.granularity)
    method = _value(m.method)
    if m.recompute_activations:
        if gran not in (None, "selective"):
            raise MeshplanError("--recompute-activations is --recompute-granularity selective; "
                                f"it contradicts --recompute-granularity {gran}", field="--recompute-activations")
        gran = "selective"
    if gran is None:
        if method is not None or m.recompute_layers is not None:
            flag = "--recompute-method" if method is not None else "--recompute-num-layers"
            raise MeshplanError(f"{flag} needs --recompute-granularity full", field=flag)
        return None
    if gran == "selective":
        if method is not None or m.recompute_layers is not None:
            flag = "--recompute-method" if method is not None else "--recompute-num-layers"
            raise MeshplanError(f"{flag} is not taken with --recompute-granularity selective "
                                "(Megatron-LM: selective recompute always covers all layers)", field=flag)
        return "selective"
    if method is None:
        raise MeshplanError("--recompute-granularity full needs --recompute-method uniform or block", field="--recompute-granularity")
    n = m.recompute_layers
    if method == "uniform":
        if n not in (None, 1):
            raise MeshplanError(f"--recompute-num-layers {n} with --recompute-method uniform "
                                "(recompute units of several layers) is not modelled; meshplan's "
                                "full recompute keeps each layer's input (--recompute-num-layers 1)", field="--recompute-num-layers")
        return "full"
    chunk = layers_per_chunk()
    if n is None or n < chunk:
        raise MeshplanError(f"--recompute-method block with --recompute-num-layers {n} "
                            f"recomputes only part of each model chunk's {chunk} layers, which is "
                            f"not modelled; give --recompute-num-layers {chunk} (every layer) or "
                            "--recompute-method uniform", field="--recompute-method")
    return "full"


def model_layers(model: str, seq_len: int | None = None, layers: int | None = None) -> int:
    """The decoder layer count of ``model`` (a name, config.json or program), or ``layers``
    when given (the ``--layers`` override). Raises what ``resolve_model`` raises."""
    if layers is not None:
        return int(layers)
    from completion.models.source import resolve_model

    return int(resolve_model(model, seq_len).num_layers)


def dtype_of(cl: GivenFlags, dtype: Any, m: MegatronArgs,
             note: Callable[[str], None] | None = None) -> Any:
    """``dtype`` (``--dtype``'s value) with Megatron's precision flags of ``m`` translated
    into it (module docstring); ``note(text)`` is told what is costed as something else
    (``--fp8-recipe tensorwise``). Raises MeshplanError naming the flags at fault: --bf16 with
    --fp16, --fp8-recipe without --fp8-format, FP8 with --fp16, a --dtype that says
    otherwise, an --fp8-amax-compute-algo other than max / most_recent."""
    if m.fp8_amax_algo is not None and m.fp8_amax_algo not in ("max", "most_recent"):
        raise MeshplanError(f"--fp8-amax-compute-algo {m.fp8_amax_algo!r}: Megatron-LM takes max or "
                            "most_recent", field="--fp8-amax-compute-algo")
    if m.bf16 and m.fp16:
        raise MeshplanError("--bf16 and --fp16 both given: Megatron-LM trains in one of them", field="--bf16")
    if m.fp8_recipe is not None and m.fp8_format is None:
        raise MeshplanError("--fp8-recipe needs --fp8-format (hybrid or e4m3), as in Megatron-LM", field="--fp8-recipe")
    if m.fp8_format is not None and m.fp16:
        raise MeshplanError("--fp8-format with --fp16: meshplan's FP8 recipes run BF16 beside the "
                            "FP8 linears; give --bf16", field="--fp8-format")
    if m.fp8_format is not None:
        recipe = str(_value(m.fp8_recipe or "delayed"))
        want, flag = FP8_RECIPE_DTYPES[recipe], "--fp8-format"
        if recipe == "tensorwise":
            if note is not None:
                note("--fp8-recipe tensorwise (Transformer Engine current scaling) is costed as "
                     "delayed scaling, fp8-delayed: its amax pass before each cast is not costed")
    elif m.bf16 or m.fp16:
        want, flag = ("bfloat16", "--bf16") if m.bf16 else ("float16", "--fp16")
    else:
        return dtype
    if cl.given("dtype") and str(_value(dtype)) != want:
        raise _conflict(cl, "dtype", flag, f"they ask for {_value(dtype)} and {want}")
    return want


def _layout_knobs(cl: GivenFlags, text: str, pp: int, knobs: dict[str, Any],
                  num_layers: Callable[[], int]) -> dict[str, Any]:
    """``layers_per_stage`` and ``vpp`` of ``--pipeline-model-parallel-layout`` on ``pp``
    pipeline ranks (vpp = stages / pp, as Megatron-LM derives it). Raises MeshplanError
    naming the layout when its layers are not the model's (``num_layers()``), its stages do
    not divide by pp or need pp > 1, or a typed vpp or ``--layers-per-stage`` disagrees."""
    split = layout_split(text)
    flag = "--pipeline-model-parallel-layout"
    if sum(split) != num_layers():
        raise MeshplanError(f"{flag} {text!r} places {sum(split)} decoder layers, the model has "
                            f"{num_layers()}", field=flag)
    if pp == 1 and len(split) > 1:
        raise MeshplanError(f"{flag} {text!r} has {len(split)} stages but "
                            f"{cl.flag('pp')} is 1: give the pipeline size they run on", field=flag)
    if len(split) % pp:
        raise MeshplanError(f"--pipeline-model-parallel-layout {text!r} has {len(split)} stages, "
                            f"not a multiple of {cl.flag('pp')} {pp}", field="--pipeline-model-parallel-layout")
    vpp = len(split) // pp
    if cl.given("vpp") and int(_value(knobs.get("vpp")) or 1) != vpp:
        raise _conflict(cl, "vpp", "--pipeline-model-parallel-layout",
                        f"the layout's {len(split)} stages on pp {pp} are {vpp} per rank")
    if cl.given("layers_per_stage"):
        raise _conflict(cl, "layers_per_stage", "--pipeline-model-parallel-layout",
                        "both give the pipeline split")
    return {"vpp": vpp, "layers_per_stage": split}


def _fsdp_knobs(cl: GivenFlags, m: MegatronArgs, knobs: dict[str, Any], dp: int | None) -> dict[str, Any]:
    """``zero`` (and ``fsdp_shard_size``) of the Megatron-FSDP arguments: the sharding
    strategy's stage (:data:`FSDP_ZERO`; Megatron-FSDP's default ``no_shard``), HSDP's
    ``dp / K`` shard group for K optimizer instances. Raises MeshplanError naming the flags
    when they contradict ``--zero``, need Megatron-FSDP, or K does not divide dp."""
    out: dict[str, Any] = {}
    sharding = _value(m.dp_sharding)
    if m.optimizer_instances not in (None, 1) and not m.megatron_fsdp:
        raise MeshplanError(f"--num-distributed-optimizer-instances {m.optimizer_instances} without "
                            "--use-megatron-fsdp is Megatron-LM's partial distributed optimizer "
                            "(ZeRO-1 within each of K groups), which meshplan does not model", field="--num-distributed-optimizer-instances")
    if sharding is not None and not m.megatron_fsdp:
        raise MeshplanError("--data-parallel-sharding-strategy sets Megatron-FSDP: give "
                            "--use-megatron-fsdp with it", field="--data-parallel-sharding-strategy")
    if not m.megatron_fsdp:
        return out
    zero = FSDP_ZERO[sharding or "no_shard"]
    if cl.given("zero") and int(_value(knobs["zero"])) != zero:
        raise _conflict(cl, "zero", f"--data-parallel-sharding-strategy {sharding or 'no_shard'}",
                        f"they ask for ZeRO stages {_value(knobs['zero'])} and {zero}")
    out["zero"] = zero
    k = m.optimizer_instances
    if m.outer_sharding not in (None, "no_shard"):
        raise MeshplanError(f"--outer-dp-sharding-strategy {m.outer_sharding}: meshplan costs HSDP "
                            "replicas that keep whole copies (no_shard)", field="--outer-dp-sharding-strategy")
    if k is not None and k > 1:
        if zero != 3:
            raise MeshplanError(f"--num-distributed-optimizer-instances {k}: meshplan's HSDP is "
                                "ZeRO-3 in shard groups (--data-parallel-sharding-strategy "
                                "optim_grads_params)", field="--num-distributed-optimizer-instances")
        if dp is None or dp % k or dp // k < 2:
            raise MeshplanError(f"--num-distributed-optimizer-instances {k} must divide "
                                f"{cl.flag('dp')} {dp} into shard groups of 2 or more", field="--num-distributed-optimizer-instances")
        if cl.given("fsdp_shard_size") and int(knobs.get("fsdp_shard_size") or 0) != dp // k:
            raise _conflict(cl, "fsdp_shard_size", "--num-distributed-optimizer-instances",
                            f"the shard group is dp / K = {dp // k}")
        out["fsdp_shard_size"] = dp // k
    return out


#: Megatron-LM overlap switch -> (its MegatronArgs field, the profile's ``overlap`` fact)
OVERLAP_SWITCHES = {"--overlap-grad-reduce": ("overlap_grad_reduce", "dp_grad_reduce"),
                    "--overlap-param-gather": ("overlap_param_gather", "dp_param_gather"),
                    "--tp-comm-overlap": ("tp_comm_overlap", "tp_forward")}


def check_overlaps(m: MegatronArgs, framework: Any) -> None:
    """The switches of :data:`OVERLAP_SWITCHES` name overlaps the ``framework`` profile must
    cost; one the profile does not overlap is refused naming it (the figures would be of
    another run)."""
    given = [flag for flag, (field, _) in OVERLAP_SWITCHES.items() if getattr(m, field)]
    if not given:
        return
    from simulator.profiles import load_profile

    name = str(_value(framework))
    ov = load_profile(name).overlap
    for flag in given:
        if not getattr(ov, OVERLAP_SWITCHES[flag][1]).value:
            raise MeshplanError(f"{flag}: the {name} profile does not overlap it; a profile that "
                                "does (megatron-core, nemo, megatron-bridge) costs that run", field=flag)


def check_grad_reduce(m: MegatronArgs, framework: Any, dtype: Any) -> None:
    """``--grad-reduce-in-bf16`` must be what the ``framework`` profile costs: a bf16 plan
    whose profile reduces gradients in their own dtype (``gradients.reduce_dtype: same``:
    nemo, megatron-bridge); megatron-core reduces in fp32, Megatron-LM's default with --bf16.
    Raises MeshplanError naming the profile otherwise."""
    if not m.grad_reduce_bf16:
        return
    from simulator.profiles import load_profile

    name = str(_value(framework))
    if str(_value(dtype)) != "bfloat16" and not str(_value(dtype)).startswith("fp8"):  # FP8 is bf16 too
        raise MeshplanError(f"--grad-reduce-in-bf16 needs bf16 training (--bf16), got {_value(dtype)}", field="--grad-reduce-in-bf16")
    if load_profile(name).gradients.reduce_dtype.value != "same":
        raise MeshplanError(f"--grad-reduce-in-bf16: the {name} profile reduces gradients in fp32 "
                            "(Megatron-LM's default); --framework nemo or megatron-bridge reduce "
                            "them in bf16", field="--grad-reduce-in-bf16")


def apply(cl: GivenFlags, knobs: dict[str, Any], m: MegatronArgs,
          num_layers: Callable[[], int], searched: bool = False,
          dp: int | None = None, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``knobs`` (Strategy fields as the shared options gave them: pp, vpp, schedule,
    recompute, zero, and dtype where given) with the Megatron arguments ``m`` translated
    into them, ``optimizer`` added by ``--optimizer`` (see the module
    docstring); ``num_layers`` gives the model's decoder layer count, called only when
    needed. ``searched`` (``tune``): ``knobs`` holds only the pinned knobs, and a knob a
    translation needs (pp, vpp) but is searched is an error. ``dp``: the data-parallel degree
    (Megatron-FSDP's HSDP shard group is dp / K). ``cl``: the flags typed (a value typed
    beside a Megatron argument that sets it too is a contradiction; errors name flags as
    typed). ``note(text)``: told what is costed as something else. Raises MeshplanError
    naming the flags at fault (``.field``: the Megatron-LM argument)."""
    out = dict(knobs)
    if searched and m.needs_layers():
        flag = ("--num-layers-per-virtual-pipeline-stage" if m.vpp_layers is not None
                else "--recompute-method block")
        need = [f for f in ("pp", "vpp") if f not in out
                and not (f == "vpp" and m.vpp_layers is not None)]
        if need:
            raise MeshplanError(f"{flag} needs the layers per pipeline stage: pin "
                                + " and ".join(FLAG_NAMES[f] for f in need) + " too", field=flag)
    pp = int(out.get("pp", 1) or 1)
    if m.distributed_optimizer and not m.megatron_fsdp:
        if cl.given("zero") and int(out["zero"]) != 1:
            raise _conflict(cl, "zero", "--use-distributed-optimizer",
                            f"the distributed optimizer is ZeRO stage 1, not {out['zero']}")
        out["zero"] = 1
    out.update(_fsdp_knobs(cl, m, out, dp))
    # either spelling of the virtual pipeline size switches a default schedule to VPP
    # (``cost``, ``export``); ``tune`` keeps its schedule searched with --vpp
    megatron_vpp = cl.typed("--num-virtual-stages-per-pipeline-rank",
                         *(() if searched else ("--vpp",)))
    if m.pipeline_layout is not None:
        out.update(_layout_knobs(cl, m.pipeline_layout, pp, out, num_layers))
        megatron_vpp = megatron_vpp or ["--pipeline-model-parallel-layout"]
    if m.vpp_layers is not None:
        if cl.given("vpp"):
            raise _conflict(cl, "vpp", "--num-layers-per-virtual-pipeline-stage",
                            "both set the virtual pipeline size")
        layers = num_layers()
        if layers % pp:
            raise MeshplanError(f"--num-layers-per-virtual-pipeline-stage: the model's {layers} "
                                f"layers do not divide by {cl.flag('pp')} {pp}", field="--num-layers-per-virtual-pipeline-stage")
        per_stage = layers // pp
        if per_stage % m.vpp_layers:
            raise MeshplanError(f"--num-layers-per-virtual-pipeline-stage {m.vpp_layers} does not "
                                f"divide the {per_stage} layers of each pipeline stage "
                                f"({layers} layers / {cl.flag('pp')} {pp})", field="--num-layers-per-virtual-pipeline-stage")
        out["vpp"] = per_stage // m.vpp_layers
        megatron_vpp = ["--num-layers-per-virtual-pipeline-stage"]
    if megatron_vpp and int(out.get("vpp") or 1) > 1 and not cl.given("schedule"):
        out["schedule"] = "VPP"  # Megatron-LM runs interleaved 1F1B whenever vpp > 1
    elif megatron_vpp and int(out.get("vpp") or 1) > 1:
        from completion.strategy import interleaved

        sched = str(_value(out.get("schedule")))
        if not interleaved(sched):
            raise MeshplanError(f"{megatron_vpp[0]} gives {out['vpp']} model chunks per pipeline "
                                f"rank, but --schedule {sched} runs one: use --schedule VPP (or "
                                f"ZBVPP), or drop {megatron_vpp[0]}", field=megatron_vpp[0])

    def layers_per_chunk() -> int:
        return max(1, num_layers() // (pp * int(out.get("vpp") or 1)))

    if "dtype" in out:
        out["dtype"] = dtype_of(cl, out["dtype"], m, note)
    if m.optimizer is not None:
        out["optimizer"] = OPTIMIZERS[str(_value(m.optimizer))]
    rec = _recompute(cl, m, layers_per_chunk)
    if rec is not None:
        if cl.given("recompute") and _value(out["recompute"]) != rec:
            raise _conflict(cl, "recompute", "--recompute-granularity",
                            f"they ask for {_value(out['recompute'])} and {rec} recompute")
        out["recompute"] = rec
    return out
