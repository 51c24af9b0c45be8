"""The training frameworks' own config code, loaded on a CPU host (the ``frameworks`` extra of
pyproject.toml), for tests/meshplan/test_frameworks_real.py.

- DeepSpeed 0.19.8: ``deepspeed.runtime.config.DeepSpeedConfig(config, mpu)``. Its batch-key
  rule (``train_batch_size == micro x gradient_accumulation_steps x world_size``,
  ``_batch_assertion``) takes ``world_size`` from ``mpu.get_data_parallel_world_size()``
  when an mpu is passed, else from ``deepspeed.comm.get_world_size()``, and only while
  torch.distributed is initialised (``runtime/config.py`` ``DeepSpeedConfig.__init__``,
  lines 456-474 of the 0.19.8 wheel); otherwise it is 1. :func:`deepspeed_config` runs it
  under a 1-rank gloo group with an mpu (:class:`MPU`) whose data-parallel size is the one
  DeepSpeed would see.
- Megatron-Core 0.16.1: ``megatron.core.transformer.TransformerConfig``, built from
  Megatron-LM arguments as Megatron-LM's ``core_transformer_config_from_args`` does
  (``megatron/training/argument_utils.py`` at NVIDIA/Megatron-LM d98e8a64: every field
  whose name is an argparse dest, plus its special cases) after the few values that
  ``validate_args`` derives (``megatron/training/arguments.py`` at d98e8a64): see
  :func:`megatron_namespace` and :func:`transformer_config`.
- torchtitan 0.2.2 (the last release that reads a job TOML):
  ``torchtitan.config.ConfigManager().parse_args(["--job.config_file", path])``.
  ``import torchtitan`` runs ``torchtitan/__init__.py``, which imports triton (GPU only),
  so :func:`torchtitan_config_manager` puts a bare parent package in ``sys.modules`` first
  and imports only ``torchtitan.config`` (torchtitan's own config code, unchanged).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import types
import warnings
from typing import Any

# -- DeepSpeed ---------------------------------------------------------------------------


class MPU:
    """The model-parallel unit DeepSpeedConfig asks for its data-parallel world size (and the
    engine for the others); sizes as given."""

    def __init__(self, dp: int, tp: int = 1, pp: int = 1) -> None:
        self.dp, self.tp, self.pp = dp, tp, pp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return self.tp * self.pp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp

    def get_sequence_parallel_world_size(self) -> int:
        return 1


def one_rank_group() -> bool:
    """A 1-rank gloo process group, handed to ``deepspeed.comm`` (DeepSpeedConfig reads the
    mpu only while ``deepspeed.comm.get_rank()`` answers: ``comm/comm.py``
    ``init_distributed`` wraps a torch.distributed group the caller initialised). Its
    TorchBackend would JIT-compile DeepSpeed's shared-memory CPU collective kernel
    (``comm/torch.py`` ``build_shm_op``), which no config check needs: it is marked
    unavailable first. Returns whether it created the group (the caller then destroys it, so no
    later test in the same worker finds a default group it did not make)."""
    import deepspeed.comm
    import deepspeed.ops
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return created


def deepspeed_config(config: dict[str, Any], dp: int) -> Any:
    """DeepSpeed's own ``DeepSpeedConfig`` of ``config`` with ``dp`` ranks in its batch rule
    (raises what DeepSpeed raises: AssertionError for bad batch keys, pydantic's
    ValidationError for a bad section)."""
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    created = one_rank_group()
    try:
        return DeepSpeedConfig(dict(config), mpu=MPU(dp))
    finally:
        if created:
            dist.destroy_process_group()


# -- Megatron-Core ---------------------------------------------------------------------------

#: Megatron-LM d98e8a64 arguments whose dest is not their name with ``-`` -> ``_``
#: (``transformer_config.py`` argparse_meta ``arg_names``, ``arguments.py`` ``dest=``)
DESTS = {"--fp8-format": ("fp8", None), "--disable-bias-linear": ("add_bias_linear", False),
         "--no-gradient-accumulation-fusion": ("gradient_accumulation_fusion", False),
         "--norm-epsilon": ("layernorm_epsilon", None)}
#: arguments that take several values (nargs='+')
LISTS = ("--cp-comm-type",)


def _value(text: str) -> Any:
    """A value as Megatron-LM's argparse types give it: int, float, a ``[..]`` list (the
    ``moe_freq_type`` of ``--moe-layer-freq``), else the string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.startswith("["):
        return [int(x) for x in text.strip("[]").split(",")]
    return text


def parse_args(argv: list[str]) -> dict[str, Any]:
    """``--name value`` / ``--flag`` arguments as argparse dests (``--`` dropped, ``-`` ->
    ``_``, :data:`DESTS` for the renamed ones; a flag alone is True, or DESTS' value)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        dest, flag_value = DESTS.get(name, (name[2:].replace("-", "_"), None))
        values = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values.append(_value(argv[i + 1]))
            i += 1
        if not values:
            out[dest] = True if flag_value is None else flag_value
        else:
            out[dest] = values if name in LISTS else values[0]
        i += 1
    return out


def export_argv(text: str) -> list[str]:
    """The arguments of a ``meshplan export --to megatron`` text (comments dropped)."""
    return shlex.split(" ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.startswith("#")))


def model_args(cfg: Any) -> list[str]:
    """The Megatron-LM model arguments of a llama-family meshplan model (the ``<model and
    data arguments>`` the export leaves to the user): sizes, grouped-query attention,
    SwiGLU, RMSNorm, no linear biases."""
    args = ["--hidden-size", str(cfg.hidden_size), "--num-attention-heads", str(cfg.num_heads),
            "--ffn-hidden-size", str(cfg.ffn_hidden_size), "--swiglu", "--normalization", "RMSNorm",
            "--disable-bias-linear", "--max-position-embeddings", str(cfg.seq_len)]
    if cfg.num_kv_heads != cfg.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(cfg.num_kv_heads)]
    if cfg.kv_channels:
        args += ["--kv-channels", str(cfg.kv_channels)]
    if cfg.qk_norm:
        args.append("--qk-layernorm")
    return args


def megatron_namespace(argv: list[str]) -> argparse.Namespace:
    """The parsed arguments with what Megatron-LM d98e8a64's ``validate_args``
    (``arguments.py``) derives before building the config: ``params_dtype`` from
    ``--bf16`` / ``--fp16`` (float32 otherwise, lines 1196-1205), the virtual pipeline size
    from ``--pipeline-model-parallel-layout`` (its stage count over pp, via Megatron-Core's
    ``PipelineParallelLayerLayout.get_num_stages_from_str``, lines 941-952),
    ``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``
    (lines 953-979; 1 -> None), and ``expert_tensor_parallel_size`` None -> tp."""
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    a = parse_args(argv)
    a.setdefault("tensor_model_parallel_size", 1)
    a.setdefault("pipeline_model_parallel_size", 1)
    pp = a["pipeline_model_parallel_size"]
    a["params_dtype"] = torch.bfloat16 if a.get("bf16") else torch.half if a.get("fp16") else torch.float
    vpp = None
    if "pipeline_model_parallel_layout" in a:
        vpp = PipelineParallelLayerLayout.get_num_stages_from_str(a["pipeline_model_parallel_layout"]) // pp
    elif "num_layers_per_virtual_pipeline_stage" in a:
        vpp = a["num_layers"] // pp // a["num_layers_per_virtual_pipeline_stage"]
    elif "num_virtual_stages_per_pipeline_rank" in a:
        vpp = a["num_virtual_stages_per_pipeline_rank"]
    a["virtual_pipeline_model_parallel_size"] = None if vpp == 1 else vpp
    if a.get("expert_tensor_parallel_size") is None:
        a["expert_tensor_parallel_size"] = a["tensor_model_parallel_size"]
    return argparse.Namespace(**a)


def transformer_config(argv: list[str]) -> Any:
    """Megatron-Core's ``TransformerConfig`` of Megatron-LM arguments, built as
    ``core_transformer_config_from_args`` (``argument_utils.py`` at d98e8a64) builds it:
    every field whose name is a dest, then its special cases that apply to these
    arguments (``pipeline_dtype`` = ``params_dtype``, ``num_moe_experts`` =
    ``--num-experts``, SwiGLU -> ``gated_linear_unit`` with silu, ``num_query_groups`` only
    with ``--group-query-attention``, a single ``--cp-comm-type`` as a string,
    ``batch_p2p_comm`` = not ``--overlap-p2p-comm``, ``deallocate_pipeline_outputs``,
    ``persist_layer_norm``) and the ``--attention-backend`` name as its enum. Raises what
    Megatron-Core's ``__post_init__`` raises (ValueError, AssertionError)."""
    import dataclasses

    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    args = megatron_namespace(argv)
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TransformerConfig) if hasattr(args, f.name)}
    kw["persist_layer_norm"] = True
    kw["deallocate_pipeline_outputs"] = True
    kw["pipeline_dtype"] = args.params_dtype
    kw["batch_p2p_comm"] = not getattr(args, "overlap_p2p_comm", False)
    kw["num_moe_experts"] = getattr(args, "num_experts", None)
    if getattr(args, "swiglu", False):
        kw["activation_func"], kw["gated_linear_unit"] = F.silu, True
    kw["num_query_groups"] = args.num_query_groups if getattr(args, "group_query_attention", False) else None
    if isinstance(kw.get("cp_comm_type"), list) and len(kw["cp_comm_type"]) == 1:
        kw["cp_comm_type"] = kw["cp_comm_type"][0]
    if isinstance(kw.get("attention_backend"), str):
        kw["attention_backend"] = AttnBackend[kw["attention_backend"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(**kw)


# -- torchtitan ------------------------------------------------------------------------------


def torchtitan_config_manager() -> Any:
    """torchtitan 0.2.2's ``ConfigManager`` class, imported without running
    ``torchtitan/__init__.py`` (which imports triton)."""
    if "torchtitan.config" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError("torchtitan is not installed (pip install -e '.[frameworks]')")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules.setdefault("torchtitan", pkg)
    from torchtitan.config import ConfigManager

    return ConfigManager


def torchtitan_job(path: str) -> Any:
    """torchtitan's own ``JobConfig`` of a job TOML (its ``ConfigManager.parse_args``)."""
    return torchtitan_config_manager()().parse_args(["--job.config_file", str(path)])


def torchtitan_parallel_dims(par: Any, world: int) -> Any:
    """torchtitan 0.2.2's own ``ParallelDims`` of a job's ``[parallelism]`` on ``world`` ranks
    (its ``__post_init__`` validates the degrees: the world's product, etp 1 or tp), as
    ``train.py`` builds it; the meshes are not built (no process group)."""
    torchtitan_config_manager()  # the package stub, without triton
    from torchtitan.distributed.parallel_dims import ParallelDims

    return ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                        pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                        etp=par.expert_tensor_parallel_degree, world_size=world)
