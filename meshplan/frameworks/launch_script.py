"""A runnable launch script for an exported plan (``meshplan export --launch FILE``): a bash
script that starts the target framework under ``torchrun`` on every node with the plan's
world size, nodes, rendezvous and the environment the plan needs, and points at the
exported file (Megatron-LM arguments, torchtitan job TOML, DeepSpeed JSON).

The same script runs by hand on each node (``MASTER_ADDR=head bash FILE``) or under Slurm
(``srun --nodes N --ntasks-per-node 1 bash FILE``: the first host of ``SLURM_JOB_NODELIST``
hosts the rendezvous); torchrun's c10d rendezvous numbers the nodes and starts one process
per GPU of the node. Per target:

- Megatron-LM: ``pretrain_gpt.py`` (``MEGATRON_LM``: the checkout) with the exported
  arguments (comments dropped, the continuations joined, ``xargs`` keeping the shell
  quoting), then the model and data arguments the user appends (``"$@"``).
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tp > 1: Megatron-Core relies on it to order the
  tensor-parallel communication before the compute it overlaps, and warns without it under
  sequence parallelism or asynchronous gradient all-reduce
  (``megatron/core/tensor_parallel/layers.py`` lines 909-921 at NVIDIA/Megatron-LM d98e8a64);
  with Megatron-FSDP (ZeRO 2/3) it is unset instead, as ``validate_args`` asserts it is not 1
  (``megatron/training/arguments.py`` line 1166) and the Megatron-FSDP guide unsets it.
- torchtitan: ``-m torchtitan.train --job.config_file`` with
  ``PYTORCH_ALLOC_CONF=expandable_segments:True``, as its ``run_train.sh`` launches it
  (pytorch/torchtitan 238fa995).
- DeepSpeed: the user's training script (``TRAIN_SCRIPT``, which calls
  ``deepspeed.initialize`` after ``deepspeed.add_config_arguments``) with ``--deepspeed
  --deepspeed_config`` the exported JSON.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MeshplanError


@dataclass(frozen=True)
class Launch:
    """How one target is started: the program torchrun runs, its arguments before the
    user's (``{config}`` stands for the exported file), the environment it sets (name ->
    value; None: unset) and the variables the user must give (name -> meaning)."""

    program: tuple[str, ...]
    env: tuple[tuple[str, str | None, str], ...]
    needs: tuple[tuple[str, str, str], ...]


def _megatron(eff: dict[str, Any]) -> Launch:
    fsdp = eff["zero"] >= 2
    env: tuple[tuple[str, str | None, str], ...] = ()
    if fsdp:
        env = (("CUDA_DEVICE_MAX_CONNECTIONS", None,
                "Megatron-FSDP: validate_args asserts it is not 1 (arguments.py line 1166 at d98e8a64)"),)
    elif eff["tp"] > 1:
        env = (("CUDA_DEVICE_MAX_CONNECTIONS", "1",
                "tensor-parallel communication ordered before the compute it overlaps "
                "(megatron/core/tensor_parallel/layers.py lines 909-921 at d98e8a64)"),)
    return Launch(program=('"$MEGATRON_LM/pretrain_gpt.py"', '"${MEGATRON_ARGS[@]}"'), env=env,
                  needs=(("MEGATRON_LM", ".", "the Megatron-LM checkout (d98e8a64's arguments)"),))


def _torchtitan(eff: dict[str, Any]) -> Launch:
    return Launch(program=("-m", "torchtitan.train", "--job.config_file", '"$CONFIG"'),
                  env=(("PYTORCH_ALLOC_CONF", "expandable_segments:True",
                        "as torchtitan's run_train.sh (238fa995) launches it"),),
                  needs=())


def _deepspeed(eff: dict[str, Any]) -> Launch:
    return Launch(program=('"$TRAIN_SCRIPT"', "--deepspeed", "--deepspeed_config", '"$CONFIG"'), env=(),
                  needs=(("TRAIN_SCRIPT", "train.py", "your training script (deepspeed.initialize after "
                                                      "deepspeed.add_config_arguments)"),))


#: target -> its :class:`Launch` of an exported layout
LAUNCHES = {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed}


def nodes_and_gpus(world: int, per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) for ``world`` ranks on nodes of ``per_node`` GPUs (one
    rank per GPU; fewer ranks than a node's GPUs: one node). Raises MeshplanError when the
    ranks do not fill whole nodes."""
    if world <= per_node:
        return 1, world
    if world % per_node:
        raise MeshplanError(f"the exported job's {world} ranks do not fill nodes of {per_node} GPUs",
                            field="nodes")
    return world // per_node, per_node


def launch_script(plan: Any, out: Any, config_path: str, script_path: str) -> str:
    """The bash launch script of ``out`` (the Export of ``plan``) whose exported file is at
    ``config_path`` and which is written to ``script_path`` (the file is named relative to
    the script's folder, so the pair can move together). Raises MeshplanError when the
    job's ranks do not fill whole nodes of the plan's cluster."""
    from clusters import load_cluster

    eff = out.effective
    world = eff["dp"] * eff["tp"] * eff["pp"] * eff["cp"]
    nnodes, nproc = nodes_and_gpus(world, load_cluster(plan.cluster, plan.nodes).devices_per_node)
    how = LAUNCHES[out.target](eff)
    rel = os.path.relpath(os.path.abspath(config_path), os.path.dirname(os.path.abspath(script_path)))
    lines = ["#!/usr/bin/env bash",
             f"# {out.target} launch script for {plan.model} on {plan.cluster} (meshplan export): "
             f"{world} ranks = dp {eff['dp']} x tp {eff['tp']} x pp {eff['pp']} x cp {eff['cp']}, "
             f"{nnodes} node(s) x {nproc} GPUs",
             "# run it on every node: MASTER_ADDR=<first node> bash "
             f"{os.path.basename(script_path)} [more arguments] (c10d rendezvous: torchrun numbers the nodes)",
             f"# or under Slurm: srun --nodes {nnodes} --ntasks-per-node 1 bash {os.path.basename(script_path)}",
             "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             f'CONFIG="$HERE"/{shlex.quote(rel)}',
             f"NNODES={nnodes}",
             f"NPROC_PER_NODE={nproc}",
             'if [ -z "${MASTER_ADDR:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
             '  MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
             "fi",
             'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
             'MASTER_PORT="${MASTER_PORT:-29500}"']
    for name, default, what in how.needs:
        lines += [f"# {name}: {what}", f'{name}="${{{name}:-{default}}}"']
    for name, value, why in how.env:
        lines += [f"# {why}", f"export {name}={shlex.quote(value)}" if value is not None else f"unset {name}"]
    if out.target == "megatron":
        lines += ["# the exported arguments: comments dropped, continuations joined, shell quoting kept",
                  "mapfile -t MEGATRON_ARGS < <(sed -e '/^#/d' -e 's/\\\\$//' \"$CONFIG\" | xargs printf '%s\\n')"]
    lines += ['exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \\',
              '    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id meshplan \\',
              f'    {" ".join(how.program)} "$@"']
    return "\n".join(lines) + "\n"


__all__ = ["LAUNCHES", "Launch", "launch_script", "nodes_and_gpus"]
