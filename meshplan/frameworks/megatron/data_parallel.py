"""Megatron-LM's data-parallel size: a command line that speaks Megatron-LM means Megatron's
semantics.

Megatron-LM has no data-parallel argument: ``validate_args`` (``megatron/training/
arguments.py`` at NVIDIA/Megatron-LM d98e8a64) requires the world size to divide by
tp x pp x cp and sets ``data_parallel_size = world_size // total_model_size``. meshplan's
own ``--dp`` defaults to 1, so a Megatron-LM launch line pasted into ``meshplan cost`` or
``export`` without ``--dp`` would cost a job on tp x pp x cp GPUs where Megatron runs one on
all of them. :func:`megatron_dp` gives the Megatron reading: when the command line holds a
Megatron-LM argument (:func:`megatron_spelled`) and no ``--dp``, dp is the world over
tp x pp x cp, with a note saying so. ``strategy_from_args`` (the Python API of a whole
launch line) always reads it that way.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.frameworks.given import GivenFlags
from meshplan.frameworks.megatron.launch_line import FIELD_ARGS, MEGATRON_ARGS


def megatron_spelled(given: GivenFlags) -> list[str]:
    """The parallelism and training flags of ``given`` that only a Megatron-LM launch line
    spells so, in the order typed: the Megatron names of Strategy fields that are not
    meshplan's own flag for the field (``--tensor-model-parallel-size``, not
    ``--micro-batch-size``, which is both) and the Megatron-only arguments
    (``--use-distributed-optimizer``, ``--recompute-granularity``, ...). A launch line's
    architecture and cost-neutral arguments (``--hidden-size``, ``--lr``) say nothing of
    its parallel layout and do not count."""
    own = {flags[0] for flags in given.flags.values()}
    megatron = {f for f in FIELD_ARGS if f not in own} | set(MEGATRON_ARGS)
    typed = [a.split("=", 1)[0] for a in given.args if a.startswith("--")]
    return list(dict.fromkeys(f for f in typed if f in megatron))


def megatron_dp(given: GivenFlags, tp: int, pp: int, cp: int, world: int) -> tuple[int, str] | None:
    """``(dp, note)`` when ``given`` holds Megatron-LM arguments and no ``--dp``: dp = the
    ``world`` GPUs over tp x pp x cp, as Megatron-LM derives it; None otherwise (the typed
    ``--dp``, or meshplan's default 1, which is then also Megatron's, stands).

    Raises:
        MeshplanError: tp x pp x cp does not divide the world (Megatron-LM's ``validate_args``
            refuses it too); ``.field`` the tensor-parallel flag as typed.
    """
    if given.given("dp"):
        return None
    spelled = megatron_spelled(given)
    if not spelled:
        return None
    model = tp * pp * cp
    if world < 1 or world % model:
        raise MeshplanError(f"{given.flag('tp')} {tp} x {given.flag('pp')} {pp} x {given.flag('cp')} {cp} = "
                            f"{model} does not divide the {world} GPUs: Megatron-LM's data-parallel size is "
                            f"the world over them (or give --dp)", field=given.flag("tp"))
    dp = world // model
    if dp == 1:  # as meshplan's default: nothing to say
        return None
    shown = ", ".join(spelled[:3]) + (", ..." if len(spelled) > 3 else "")
    return dp, (f"dp {dp} = {world} GPUs / (tp {tp} x pp {pp} x cp {cp}), as Megatron-LM derives it "
                f"(Megatron-LM arguments given: {shown}; no --dp)")


__all__ = ["megatron_dp", "megatron_spelled"]
