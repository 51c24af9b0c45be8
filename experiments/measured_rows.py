"""One row of ``shared/data/measured_runs.csv`` -> what meshplan needs to predict it.

``shared/reference/measured_runs.md`` documents the file: 171 published, measured training
runs of dense decoder-only transformers (MosaicML llm-foundry MPT tables, NVIDIA DGX Cloud
NeMo recipes, torchtitan's December 2024 H100 tables, Megatron-LM 2021 Table 1), one row
each, every cell as the source states it (numbers, sometimes with words: ``"8192 (config
default, not stated in table)"``, ``"GPT2BPE 50257 padded to 50688 (128*TP4)"``).

:func:`parse_row` turns one row (a mapping column -> cell text) into either

- a :class:`RunSpec`: the model as a :class:`completion.models.ModelConfig`, the cluster
  (a ``clusters/catalog`` name and a node count), the :class:`completion.strategy.Strategy`
  (layout, schedule, micro/global batch, recompute, ZeRO stage, sequence parallelism,
  dtype, framework profile, attention kernel), the sequence length, the measured step
  time (s) and peak memory (bytes) where given, and the lists of ``approximations`` (what
  meshplan models differently from the row, e.g. ALiBi as learned positions) and
  ``assumptions`` (what the row did not state and we filled in); or
- a :class:`Refused` (``expressible=False``) whose one-line ``why`` names the field that
  meshplan cannot express today (context parallelism, ...).

What meshplan cannot express is decided by one table, :data:`UNSUPPORTED`, so that later
work that adds a feature deletes one entry (FP8 GEMMs and squared-ReLU MLPs were lifted by
issue 17: ``experiments.measured_cells.FP8_PRECISIONS``, :data:`FFN_TYPES`). The cells are read by
:mod:`experiments.measured_cells`.
No row raises: a cell that cannot be read is a refusal naming the column.

Rows measured after the CSV was frozen live in the repository (:data:`EXTRA_CSVS`, e.g.
``experiments/data/measured_runs_moe.csv``: mixture-of-experts runs): the CSV's columns plus
the optional :data:`MOE_COLUMNS` (experts, top-k, expert width, ...) and ``ep``; each row
names its own source (``source_id``, ``source_url``, ``locator``). :func:`parse_measured`
parses the CSV and them; :func:`parse_all` the CSV alone (what the fits read:
``experiments.fit_constants``).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from completion.errors import InputFileNotFoundError
from completion.models.catalog import MEGATRON_2021
from completion.models.config import ModelConfig, ModelConfigError
from completion.strategy import Strategy, StrategyError
from experiments.base import ExperimentError
from experiments.measured_cells import (
    FP8_PRECISIONS,
    Notes,
    Row,
    RowError,
    attention_impl,
    cell,
    float_of,
    float_text,
    framework_profile,
    int_of,
    leading_int,
    not_stated,
    read_precision,
    read_vocab,
    recompute_mode,
    zero_stage,
)

#: the development set, beside the repository (``../shared/data/measured_runs.csv``)
DATA_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "measured_runs.csv"

#: rows files kept in the repository beside the read-only CSV (same columns, plus
#: :data:`MOE_COLUMNS` and ``ep``; row ids above 1000 so they never collide with the CSV's)
EXTRA_CSVS: tuple[Path, ...] = (Path(__file__).resolve().parent / "data" / "measured_runs_moe.csv",)

#: catalog cluster for the torchtitan rows (``clusters/catalog/grand-teton-h100-96g.yaml``)
GRAND_TETON = "grand-teton-h100-96g"

# -- what cannot be expressed today (one table; later work lifts entries) -------------------


@dataclass(frozen=True)
class Unsupported:
    """One feature meshplan cannot express yet.

    Attributes:
        key: short name used to group refusals in reports ("FP8", "cp > 1", ...).
        field: the CSV column that carries it.
        applies: predicate on the row (cell texts).
        why: one-line reason; ``{value}`` is replaced by the cell text.
    """

    key: str
    field: str
    applies: Callable[[Row], bool]
    why: str

    def reason(self, row: Row) -> str:
        """The one-line reason for ``row``, naming the field and its value."""
        return f"{self.field}={cell(row, self.field)!r}: {self.why}"


#: Features of the measured runs that Strategy / the model builders cannot take (yet).
UNSUPPORTED: tuple[Unsupported, ...] = (
)


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """A measured run meshplan can predict.

    Attributes:
        row_id, source_id, model_name: the row's identity.
        model: the model (``name`` is the row's model name).
        cluster: ``clusters/catalog`` name; nodes: node count (num_gpus / gpus_per_node).
        strategy: the layout and software (framework profile, attention kernel).
        seq_len: tokens per sequence.
        num_gpus: GPUs of the run (dp * cp * tp * pp).
        step_time_s: measured seconds per optimizer step; step_time_origin: the column it
            came from (``step_time_s``, ``derived_step_time_s`` or ``global_batch_tokens /
            (tokens_per_s_per_gpu * num_gpus)``).
        peak_mem_bytes: measured peak memory per GPU in bytes (None: not given);
            peak_mem_convention: how the source measured it (unit, reserved or allocated,
            max over GPUs), from ``peak_mem_notes``.
        approximations: what meshplan models differently from the row (one line each).
        assumptions: what the row did not state and was filled in (one line each).
    """

    row_id: int
    source_id: str
    model_name: str
    model: ModelConfig
    cluster: str
    nodes: int
    strategy: Strategy
    seq_len: int
    num_gpus: int
    step_time_s: float
    step_time_origin: str
    peak_mem_bytes: float | None = None
    peak_mem_convention: str = ""
    approximations: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @property
    def expressible(self) -> bool:
        """Always True (see :class:`Refused`)."""
        return True

    @property
    def layout(self) -> str:
        """One-line layout summary, e.g. ``dp32 tp1 pp1 mbs16 gbs512 zero0 rc=full fp16``
        (``cp`` and ``ep`` when above 1)."""
        s = self.strategy
        parts = [f"dp{s.dp}", f"tp{s.tp}", f"pp{s.pp}"] + ([f"cp{s.cp}"] if s.cp > 1 else [])
        parts += [f"ep{s.ep}"] if s.ep > 1 else []
        if s.vpp > 1:
            parts.append(f"vpp{s.vpp}")
        parts += [f"mbs{s.micro_batch_size}", f"gbs{s.global_batch_size}", f"zero{s.zero}"]
        if s.sequence_parallel:
            parts.append("sp")
        dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[s.dtype]
        if s.fp8:
            dtype = f"fp8-{s.fp8}"
        parts += [f"rc={s.recompute}", dtype, f"s{self.seq_len}"]
        return " ".join(parts)


@dataclass(frozen=True)
class Refused:
    """A measured run meshplan cannot express today.

    Attributes:
        row_id, source_id, model_name: the row's identity.
        why: one line naming the field(s) and the reason(s).
        reasons: the :data:`UNSUPPORTED` keys that apply (or ``"unreadable <column>"`` /
            ``"invalid <what>"`` for a cell the parser could not use), in table order.
        expressible: always False.
    """

    row_id: int
    source_id: str
    model_name: str
    why: str
    reasons: tuple[str, ...] = ()
    expressible: bool = field(default=False, init=False)

    @property
    def reason_key(self) -> str:
        """The reasons joined with ``" + "`` (groups rows refused for the same reasons)."""
        return " + ".join(self.reasons)


# -- cell readers ----------------------------------------------------------------------------


# -- the parts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FfnType:
    """How an ``ffn_type`` cell maps onto a model: the family (positions, biases), the MLP
    activation (``completion.models.config.ACTIVATIONS``) and the norm (None: the
    family's)."""

    match: str
    family: str
    activation: str
    norm: str | None = None


#: ``ffn_type`` cells (lower case, spaces as dashes; first match wins): GeLU -> gpt,
#: SwiGLU -> llama, squared ReLU (Nemotron-4: non-gated ``relu(x)^2``, RoPE, GQA, no
#: linear biases, layernorm1p; Nemotron-4 15B tech report, Parmar et al. 2024, sec. 2) ->
#: llama positions and biases with a layer_norm
FFN_TYPES: tuple[FfnType, ...] = (
    FfnType("squared-relu", "llama", "relu2", "layer_norm"),
    FfnType("swiglu", "llama", "swiglu"),
    FfnType("gelu", "gpt", "gelu"),
)


#: optional columns of the rows files (:data:`EXTRA_CSVS`) -> (``ModelConfig`` field, reader):
#: the mixture-of-experts fields (``completion.models.config.ModelConfig``: routed experts,
#: top-k, expert width, load-balancing loss weight) and the attention head size and q/k
#: norm that a model like Qwen3 needs; an empty or absent cell leaves the field's default
#: (the CSV's dense rows have none of them)
MOE_COLUMNS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "num_experts": ("num_experts", leading_int),
    "experts_per_token": ("experts_per_token", leading_int),
    "moe_ffn_hidden_size": ("moe_ffn_hidden_size", leading_int),
    "router_aux_loss_coef": ("router_aux_loss_coef", float_text),
    "kv_channels": ("kv_channels", leading_int),
    "qk_norm": ("qk_norm", lambda text, name: text),
}


def _moe_fields(row: Row) -> dict[str, object]:
    """The ModelConfig fields the row's :data:`MOE_COLUMNS` cells set (empty for a CSV row)."""
    return {fld: read(cell(row, col), col) for col, (fld, read) in MOE_COLUMNS.items()
            if cell(row, col)}


def _model(row: Row, notes: Notes) -> tuple[ModelConfig, int]:
    """(ModelConfig, seq_len) of a row; family, activation and norm from ffn_type
    (:data:`FFN_TYPES`)."""
    ffn_type = cell(row, "ffn_type").lower().replace(" ", "-")
    ffn = next((f for f in FFN_TYPES if f.match in ffn_type), None)
    if ffn is None:
        raise RowError("ffn_type", f"{cell(row, 'ffn_type')!r} is none of "
                       f"{[f.match for f in FFN_TYPES]}")
    family = ffn.family
    pos = cell(row, "pos_embedding")
    pos_l = pos.lower()
    own = "learned absolute positions" if family == "gpt" else "RoPE"
    kind = ("rope" if "rope" in pos_l or "rotary" in pos_l else "alibi" if "alibi" in pos_l
            else "learned" if "learned" in pos_l or "absolute" in pos_l else "?")
    if (family, kind) not in (("gpt", "learned"), ("llama", "rope")):
        notes.approximations.append(
            f"pos_embedding {pos!r} modelled as {own} (the {family} builder's; cost difference "
            "negligible)")
    norm = cell(row, "norm_bias_notes")
    norm_l = norm.lower()
    if family == "gpt" and ("rmsnorm" in norm_l or "no bias" in norm_l or "layernorm1p" in norm_l):
        notes.approximations.append(f"norm/bias {norm!r} modelled as layer_norm with biases (gpt)")
    if ffn.norm == "layer_norm" and "no bias" in norm_l:
        notes.approximations.append(f"norm {norm!r} modelled as layer_norm with weight and bias "
                                    "(2h parameters per norm; linears without biases)")
    elif family == "llama" and norm and "rmsnorm" not in norm_l and ffn.norm is None:
        notes.approximations.append(f"norm {norm!r} modelled as rms_norm without biases (llama)")
    if "low_precision_layernorm" in norm_l:
        notes.approximations.append("low_precision_layernorm modelled as layer_norm")

    vocab, vnote = read_vocab(cell(row, "vocab_size"))
    if vnote:
        notes.assumptions.append(vnote)
    seq_text = cell(row, "seq_len")
    seq = leading_int(seq_text, "seq_len")
    if not_stated(seq_text):
        notes.assumptions.append(f"seq_len {seq} assumed ({seq_text!r})")
    kv_text = cell(row, "n_kv_heads")
    kv = leading_int(kv_text, "n_kv_heads") if kv_text else int_of(row, "n_heads")
    if kv_text and not re.fullmatch(r"\d+", kv_text):
        notes.assumptions.append(f"n_kv_heads {kv} from {kv_text!r}")
    tied_text = cell(row, "tied_embeddings").lower()
    if not tied_text.startswith(("yes", "no")):
        raise RowError("tied_embeddings", f"neither yes nor no: {tied_text!r}")
    tied = tied_text.startswith("yes")
    try:
        cfg = ModelConfig(name=cell(row, "model_name"), family=family,
                          num_layers=int_of(row, "n_layers"), hidden_size=int_of(row, "hidden_size"),
                          num_heads=int_of(row, "n_heads"), num_kv_heads=kv,
                          ffn_hidden_size=int_of(row, "ffn_hidden_size"), vocab_size=vocab,
                          seq_len=seq, tie_word_embeddings=tied,
                          activation=ffn.activation, norm=ffn.norm, **_moe_fields(row))
    except ModelConfigError as e:
        raise RowError("model", str(e)) from None
    return cfg, seq


def _cluster(row: Row, notes: Notes) -> tuple[str, int]:
    """(catalog name, nodes) from gpu_type / gpu_mem_gb / num_gpus / gpus_per_node."""
    gpu = cell(row, "gpu_type")
    gpu_l = gpu.lower()
    mem = int_of(row, "gpu_mem_gb")
    inter = cell(row, "inter_node_link")
    if "a100" in gpu_l:
        if mem == 40:
            name = "dgx-a100-40g"
        elif mem == 80:
            name = "selene" if "selene" in inter.lower() else "dgx-a100-80g"
        else:
            raise RowError("gpu_mem_gb", f"no A100 catalog entry with {mem} GB")
        if "roce" in inter.lower():
            notes.approximations.append(
                f"inter-node {inter!r} modelled as the catalog's 8 x 200 Gb/s InfiniBand "
                "(same 1600 Gb/s per node)")
    elif "h100" in gpu_l:
        if mem == 96 or "grand teton" in gpu_l:
            name = GRAND_TETON
            notes.approximations.append(
                f"{GRAND_TETON}: peak bf16 of the 500 W HBM2e H100 not published; the SXM "
                "peak 989 TFLOP/s x 0.734, the measured 500 W / 700 W ratio of one bf16 GEMM "
                "(FBGEMM PR 2546 vs a 700 W H100 SXM), 726 TFLOP/s, used (approx.)")
        elif mem == 80:
            name = "dgx-h100"
        else:
            raise RowError("gpu_mem_gb", f"no H100 catalog entry with {mem} GB")
    else:
        raise RowError("gpu_type", f"no catalog entry for {gpu!r}")
    if "assumed" in gpu_l:
        notes.assumptions.append(f"gpu_type {gpu!r}")
    if inter.lower().startswith("not stated"):
        notes.assumptions.append(f"inter-node network not stated: {name}'s used")
    gpn_text = cell(row, "gpus_per_node")
    gpn = leading_int(gpn_text, "gpus_per_node")
    if not_stated(gpn_text):
        notes.assumptions.append(f"gpus_per_node {gpn} assumed")
    if gpn != 8:
        raise RowError("gpus_per_node", f"{gpn}: every catalog entry has 8 GPUs per node")
    gpus = int_of(row, "num_gpus")
    return name, max(1, math.ceil(gpus / gpn))


def _cp_comm(cp: int, framework: str, notes: Notes) -> str:
    """How a row's context-parallel attention exchanges K/V: torchtitan (the fsdp2 profiles)
    all-gathers them (``--experimental.context_parallel_rotate_method`` defaults to
    ``allgather`` in torchtitan 9dec370 ``torchtitan/config_manager.py``; the rows state no
    other), Megatron / NeMo pass them around the ring (``--cp-comm-type`` defaults to p2p)."""
    if cp == 1:
        return "p2p"
    if framework.startswith("fsdp2"):
        notes.assumptions.append("cp K/V all-gathered: torchtitan 9dec370 "
                                 "--experimental.context_parallel_rotate_method default 'allgather'")
        return "all_gather"
    return "p2p"


def _strategy(row: Row, notes: Notes) -> Strategy:
    """The Strategy of a row: layout (``ep`` where a rows file gives it), schedule (VPP
    when vpp > 1), batches, recompute, ZeRO stage, sequence parallelism, dtype, framework profile, attention kernel."""
    dp, tp, pp = int_of(row, "dp"), int_of(row, "tp"), int_of(row, "pp")
    cp = int_of(row, "cp") if cell(row, "cp") else 1
    ep = int_of(row, "ep") if cell(row, "ep") else 1  # rows files only (Strategy.ep)
    vpp_text = cell(row, "vpp") or "1"
    if not_stated(vpp_text):
        raise RowError("vpp", f"interleaving degree {vpp_text!r}")
    vpp = leading_int(vpp_text, "vpp")
    mbs_text = cell(row, "micro_batch_size")
    if not_stated(mbs_text):
        raise RowError("micro_batch_size", f"{mbs_text!r}")
    mbs = leading_int(mbs_text, "micro_batch_size")
    gbs = int_of(row, "global_batch_seqs")
    ga = float_of(row, "grad_accum") if cell(row, "grad_accum") not in ("", "n/a") else None
    if gbs % (dp * mbs) == 0 and ga is not None and gbs // (dp * mbs) != ga:
        notes.assumptions.append(f"grad_accum {ga:g} differs from global/(dp*mbs) = "
                                 f"{gbs // (dp * mbs)}; the latter used")
    sp_text = cell(row, "sequence_parallel").lower()
    sp = sp_text.startswith("yes")
    if sp and tp == 1:
        notes.approximations.append("sequence_parallel with tp = 1 has no effect; dropped")
        sp = False
    zero_text = cell(row, "zero_fsdp")
    zero = zero_stage(zero_text)
    group = re.search(r"\((\d+)\)", zero_text)
    shard = None  # HSDP: the row's shard group when it is a proper divisor of dp
    if zero == 3 and group and int(group.group(1)) != dp:
        n = int(group.group(1))
        if 2 <= n < dp and dp % n == 0:
            shard = n
        else:
            notes.approximations.append(
                f"FSDP shard group {n} is no proper divisor of dp {dp}: modelled as ZeRO-3 over dp")
    other = cell(row, "other_opts").lower()
    if "torch.compile" in other and "torch.compile=no" not in other:
        notes.approximations.append("torch.compile: fused as the fsdp2 profile says (elementwise "
                                    "chains of a block one kernel)")
    precision = cell(row, "precision")
    if "mixed_precision=default" in precision.lower():
        notes.approximations.append(
            "amp_bf16 (fp32 parameters, bf16 autocast) modelled as bf16 mixed precision")
    notes.assumptions.append("optimizer not in the row: AdamW assumed")
    framework = framework_profile(cell(row, "framework"))
    if framework == "fsdp2" and "torch.compile=no" in other:
        framework = "fsdp2-eager"
    elif framework == "fsdp2" and "async tp" in other:  # torchtitan's experimental async TP
        framework = "fsdp2-async-tp"
    if framework == "megatron-2021" and pp == 1:
        framework = "megatron-2021-torch-ddp"
        notes.assumptions.append("--DDP-impl torch, as Megatron-LM 6985e58 examples/sc21/"
                                 "run_table_1.sh runs the rows without pipeline parallelism "
                                 "(1.7B-18B; local DDP for 39B and larger)")
    if cell(row, "assumptions"):
        notes.assumptions.append(f"the row's own assumptions: {cell(row, 'assumptions')}")
    dtype, fp8 = read_precision(precision, notes)
    split = _uniform_split(row, framework, pp * vpp, notes)
    try:
        return Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, cp_comm=_cp_comm(cp, framework, notes),
                        layers_per_stage=split,
                        vpp=vpp, schedule="VPP" if vpp > 1 else "1F1B",
                        micro_batch_size=mbs, global_batch_size=gbs,
                        recompute=recompute_mode(cell(row, "activation_recompute")), zero=zero,
                        fsdp_shard_size=shard,
                        sequence_parallel=sp, dtype=dtype, optimizer="adamw", framework=framework,
                        attention=attention_impl(cell(row, "attention_impl")), fp8=fp8)
    except StrategyError as e:
        raise RowError("strategy", str(e)) from None


#: frameworks whose rows split the decoder layers evenly over the pp x vpp virtual stages
#: (the row's recipe sets no uneven split): Megatron-LM d98e8a64
#: ``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build`` gives each
#: pipeline rank ``num_layers // pp`` layers (plus one each for
#: ``account_for_embedding/loss_in_pipeline_split``) and each model chunk that over vpp,
#: unless ``num_layers_in_first/last_pipeline_stage`` is set; Megatron-Bridge 7af9601c
#: ``src/megatron/bridge/recipes/qwen/qwen3_moe.py`` ``qwen3_30b_a3b_pretrain_config``
#: sets none of them (the 235B recipe sets both account_for flags). NeMo 24.11 (the
#: dgxc_bench_24.11 rows) predates the account_for flags (Megatron-LM ef490839e8,
#: 2025-02-03, "Uneven Virtual Pipeline Parallelism"), so its Megatron-Core splits evenly;
#: Megatron-LM 2021 gives each stage num_layers // pp (the Table 1 layer counts divide).
UNIFORM_SPLIT_FRAMEWORKS = ("megatron-bridge", "nemo", "megatron-core", "megatron-2021")


def _uniform_split(row: Row, framework: str, vstages: int, notes: Notes) -> tuple[int, ...] | None:
    """The even layer split of :data:`UNIFORM_SPLIT_FRAMEWORKS` rows over ``vstages``
    virtual stages (None for other rows: the cost-balanced split, or when it is 1). Raises
    RowError when ``n_layers`` does not divide evenly (Megatron-Core asserts it)."""
    if framework not in UNIFORM_SPLIT_FRAMEWORKS or vstages == 1:
        return None
    n = int_of(row, "n_layers")
    if n % vstages:
        raise RowError("n_layers", f"{n} layers do not split evenly over pp x vpp = {vstages} "
                       f"virtual stages (Megatron-Core get_num_layers_to_build)")
    notes.assumptions.append(f"layers split evenly, {n // vstages} per virtual stage "
                             f"(Megatron-Core get_num_layers_to_build; no uneven split in the recipe)")
    return (n // vstages,) * vstages


def _step_time(row: Row, gpus: int) -> tuple[float, str]:
    """(measured seconds per step, the column it came from): ``step_time_s``, else
    ``derived_step_time_s``, else global tokens / (tokens/s/GPU x GPUs)."""
    for name in ("step_time_s", "derived_step_time_s"):
        v = float_of(row, name)
        if v is not None and v > 0:
            return v, name
    tps = float_of(row, "tokens_per_s_per_gpu")
    tokens = float_of(row, "global_batch_tokens")
    if tps and tokens:
        return tokens / (tps * gpus), "global_batch_tokens / (tokens_per_s_per_gpu * num_gpus)"
    raise RowError("step_time_s", "no step time, derived step time or tokens/s per GPU")


def read_peak_memory(row: Row) -> tuple[float | None, str]:
    """(peak memory in bytes or None, convention) from ``peak_mem_gb`` and ``peak_mem_notes``:
    GiB (2**30) when the notes say GiB, else GB (1e9); the convention names the unit and
    whether the source logged reserved or allocated memory."""
    v = float_of(row, "peak_mem_gb")
    notes = cell(row, "peak_mem_notes")
    if v is None:
        return None, ""
    nl = notes.lower()
    gib = "gib" in nl
    kind = "reserved" if "reserved" in nl else "allocated" if "allocated" in nl else "not stated"
    where = "max over GPUs" if "max" in nl else "per GPU"
    conv = f"{'GiB' if gib else 'GB'}, {kind}, {where}"
    return v * (2**30 if gib else 1e9), conv


# -- the entry points ---------------------------------------------------------------------------


def _identity(row: Row) -> tuple[int, str, str]:
    """(row_id, source_id, model_name) of a row; row_id -1 when unreadable."""
    try:
        rid = int_of(row, "row_id")
    except RowError:
        rid = -1
    return rid, cell(row, "source_id"), cell(row, "model_name")


def parse_row(row: Row) -> RunSpec | Refused:
    """A :class:`RunSpec` for one CSV row (column -> cell text), or a :class:`Refused`
    naming why meshplan cannot express it. Never raises for bad cells (they are refusals
    naming the column)."""
    rid, source, name = _identity(row)
    hits = [u for u in UNSUPPORTED if u.applies(row)]
    if hits:
        return Refused(rid, source, name, "; ".join(u.reason(row) for u in hits),
                       tuple(u.key for u in hits))
    notes = Notes()
    try:
        model, seq = _model(row, notes)
        cluster, nodes = _cluster(row, notes)
        strategy = _strategy(row, notes)
        gpus = int_of(row, "num_gpus")
        if strategy.world_size != gpus:
            raise RowError("num_gpus", f"{gpus} != dp*cp*tp*pp = {strategy.world_size}")
        if strategy.framework.startswith("megatron-2021"):
            model = model.replace(attention_dropout=MEGATRON_2021["attention_dropout"],
                                  hidden_dropout=MEGATRON_2021["hidden_dropout"])
            notes.assumptions.append(
                "dropout as Megatron-LM 6985e58 megatron/arguments.py defaults "
                "(--attention-dropout 0.1, --hidden-dropout 0.1; examples/sc21 leaves them)")
        step, origin = _step_time(row, gpus)
        mem, conv = read_peak_memory(row)
    except RowError as e:
        kind = "invalid" if e.field in ("model", "strategy") else "unreadable"
        return Refused(rid, source, name, str(e), (f"{kind} {e.field}",))
    return RunSpec(row_id=rid, source_id=source, model_name=name, model=model, cluster=cluster,
                   nodes=nodes, strategy=strategy, seq_len=seq, num_gpus=gpus,
                   step_time_s=step, step_time_origin=origin, peak_mem_bytes=mem,
                   peak_mem_convention=conv, approximations=tuple(notes.approximations),
                   assumptions=tuple(notes.assumptions))


def load_rows(path: str | Path | None = None) -> list[dict[str, str]]:
    """The rows of the measured-runs CSV (default :data:`DATA_CSV`) as dicts of cell text.
    Raises FileNotFoundError naming the path when it is absent."""
    p = Path(path) if path is not None else DATA_CSV
    if not p.is_file():
        raise InputFileNotFoundError(f"measured runs file not found: {p}")
    with p.open(newline="", encoding="utf-8") as f:
        return [dict(r) for r in csv.DictReader(f)]


def parse_all(path: str | Path | None = None) -> list[RunSpec | Refused]:
    """:func:`parse_row` of every row of the CSV, in file order."""
    return [parse_row(r) for r in load_rows(path)]


def parse_measured(extra: tuple[str | Path, ...] | None = None) -> list[RunSpec | Refused]:
    """:func:`parse_all` of the CSV, then every row of the rows files ``extra`` (default
    :data:`EXTRA_CSVS`), in file order. Raises FileNotFoundError naming a missing file, and
    ExperimentError naming a row id that two files share."""
    out = parse_all()
    for path in EXTRA_CSVS if extra is None else extra:
        out += parse_all(path)
    seen: set[int] = set()
    for p in out:
        if p.row_id in seen and p.row_id != -1:
            raise ExperimentError(f"measured runs: row_id {p.row_id} appears twice")
        seen.add(p.row_id)
    return out


__all__ = ["DATA_CSV", "EXTRA_CSVS", "MOE_COLUMNS", "FFN_TYPES", "FP8_PRECISIONS", "GRAND_TETON", "UNSUPPORTED", "FfnType", "Refused", "RowError",
           "RunSpec", "Unsupported", "load_rows", "parse_all", "parse_measured", "parse_row", "read_peak_memory",
           "read_vocab"]
