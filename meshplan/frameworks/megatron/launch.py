"""A Megatron-LM launch line on ``cost`` / ``export``: the ``pretrain_gpt.py`` arguments a
user already has, pasted after ``--model`` and ``--cluster``.

The parallelism, batch, recompute, precision, optimizer, overlap and MoE arguments are
meshplan options of their own (``megatron_args``, ``megatron_moe``). Of the rest of a launch
line (Megatron-LM d98e8a64 ``megatron/training/arguments.py`` and the config dataclasses it
turns into arguments: ``megatron/training/config/training_config.py``,
``common_config.py``, ``megatron/core/transformer/transformer_config.py``):

- arguments that leave a training step's cost alone -- learning-rate schedule, weight
  decay, gradient clipping, Adam's betas and epsilon, initialisation and seed, iteration
  and sample counts, logging, evaluation, checkpointing, data and tokenizer files, the
  distributed backend, the rotary base and norm epsilon (:data:`NEUTRAL_VALUE`,
  :data:`NEUTRAL_LIST`, :data:`NEUTRAL_SWITCHES`) -- are accepted and named in one note;
- the architecture arguments (:data:`ARCH`: hidden and MLP sizes, heads, query groups,
  head size, activation, norm, biases, qk-norm, positions, dropout, tied embeddings,
  vocabulary) are checked against ``--model``, which gives the architecture: a difference
  is an error naming the argument and both values (write a config.json to cost another);
- anything else stays an unknown option, as before: a Megatron-LM argument that changes
  the cost (a fusion switch, a kernel choice) is not silently dropped, nor a misspelled
  meshplan option.

:func:`split` runs before the command's own parsing (``options.StrategyCommand``), so the
arguments need no typer declaration; :func:`finish` checks and notes once the model is
known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MeshplanError

#: the commands that take a Megatron-LM launch line
COMMANDS = ("cost", "export")
#: where the CLI keeps, per command line (click's ``ctx.meta``), the neutral arguments as
#: typed and the architecture ones by flag
NEUTRAL_KEY = "meshplan.megatron_neutral"
ARCH_KEY = "meshplan.megatron_arch"

#: cost-neutral arguments taking one value (d98e8a64: arguments.py and the config dataclasses)
NEUTRAL_VALUE = frozenset({
    "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples",
    "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-init",
    "--weight-decay", "--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style",
    "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--sgd-momentum",
    "--init-method-std", "--seed", "--train-iters", "--train-samples", "--log-interval",
    "--eval-interval", "--eval-iters", "--save-interval", "--save", "--load", "--split",
    "--vocab-file", "--merge-file", "--tokenizer-type", "--tokenizer-model", "--tensorboard-dir",
    "--tensorboard-log-interval", "--wandb-project", "--wandb-exp-name", "--wandb-save-dir",
    "--distributed-backend", "--distributed-timeout-minutes", "--exit-interval",
    "--exit-duration-in-mins", "--ckpt-format", "--num-workers", "--dataloader-type",
    "--data-cache-path", "--timing-log-level", "--rotary-base", "--norm-epsilon",
})
#: cost-neutral arguments taking a list (``nargs='*'``)
NEUTRAL_LIST = frozenset({"--data-path", "--train-data-path", "--valid-data-path", "--test-data-path"})
#: cost-neutral switches (``store_true`` / ``store_false``)
NEUTRAL_SWITCHES = frozenset({
    "--log-throughput", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
    "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard",
    "--no-log-loss-scale-to-tensorboard", "--no-load-optim", "--no-load-rng", "--no-save-optim",
    "--no-save-rng", "--finetune", "--use-checkpoint-args", "--mock-data", "--no-mmap-bin-files",
    "--use-mcore-models", "--async-save", "--ckpt-fully-parallel-save", "--skip-train",
    "--apply-layernorm-1p",
})


@dataclass(frozen=True)
class ArchArg:
    """An architecture argument: ``switch`` (no value) or one value read by ``parse``;
    ``ours(cfg)`` the model's value in the argument's terms, compared as it is (None: the
    argument has a rule of its own in :func:`check`); ``says(cfg)``, for a switch, what the
    model has instead (the error's words)."""

    ours: Callable[[Any], Any] | None = None
    parse: Callable[[str], Any] | None = None
    says: Callable[[Any], str] | None = None

    @property
    def switch(self) -> bool:
        """True for an argument without a value (``store_true``)."""
        return self.parse is None


def _norm(v: str) -> str:
    names = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm"}
    if v not in names:
        raise MeshplanError(f"one of {', '.join(names)}")
    return names[v]


def _positions(v: str) -> str:
    names = {"rope": "rope", "learned_absolute": "learned"}
    if v not in names:
        raise MeshplanError(f"one of {', '.join(names)} (meshplan models these two)")
    return names[v]


#: architecture arguments -> how to read them and the model's value (``ModelConfig``)
ARCH: dict[str, ArchArg] = {
    "--hidden-size": ArchArg(lambda c: c.hidden_size, int),
    "--ffn-hidden-size": ArchArg(lambda c: c.ffn_hidden_size, int),
    "--num-attention-heads": ArchArg(lambda c: c.num_heads, int),
    "--num-query-groups": ArchArg(parse=int),  # with --group-query-attention: _check_attention
    "--group-query-attention": ArchArg(),
    "--kv-channels": ArchArg(lambda c: c.head_dim, int),
    "--swiglu": ArchArg(lambda c: c.mlp_activation == "swiglu",
                        says=lambda c: f"a {c.mlp_activation} MLP"),
    "--squared-relu": ArchArg(lambda c: c.mlp_activation == "relu2",
                              says=lambda c: f"a {c.mlp_activation} MLP"),
    "--normalization": ArchArg(lambda c: c.resolved_norm, _norm),
    "--untie-embeddings-and-output-weights": ArchArg(
        lambda c: not c.tie_word_embeddings, says=lambda c: "its output layer tied to the embedding"),
    "--disable-bias-linear": ArchArg(),  # the two bias switches: _check_biases
    "--add-qkv-bias": ArchArg(),
    "--qk-layernorm": ArchArg(lambda c: c.qk_norm is not None, says=lambda c: "no q/k normalisation"),
    "--position-embedding-type": ArchArg(lambda c: c.resolved_positions, _positions),
    "--use-rotary-position-embeddings": ArchArg(
        lambda c: c.resolved_positions == "rope", says=lambda c: f"{c.resolved_positions} positions"),
    "--attention-dropout": ArchArg(lambda c: c.attention_dropout, float),
    "--hidden-dropout": ArchArg(lambda c: c.hidden_dropout, float),
    "--vocab-size": ArchArg(lambda c: c.vocab_size, int),
    # at least the sequence; learned positions: the table's rows (check)
    "--max-position-embeddings": ArchArg(parse=int),
}
#: the arguments that make a launch line describe the model: with one of them, a switch or
#: value it leaves out is Megatron-LM's default (TransformerConfig at d98e8a64: GeLU, biases
#: on, LayerNorm, learned absolute positions, tied embeddings, dropout 0.1, no qk-norm, one
#: key/value group with --group-query-attention), checked against --model too
DESCRIBING = ("--hidden-size", "--num-attention-heads", "--ffn-hidden-size")


def split(args: Sequence[str]) -> tuple[list[str], list[str], dict[str, str | bool]]:
    """``(kept, neutral, arch)``: the command-line tokens other than the Megatron-LM
    launch-line arguments of this module, those cost-neutral ones as typed (``"--lr 3e-4"``)
    and the architecture ones (flag -> value, ``True`` for a switch). Both ``--flag value``
    and ``--flag=value`` are read; tokens after ``--`` are kept as they are. Raises
    MeshplanError for a value argument without its value."""
    kept: list[str] = []
    neutral: list[str] = []
    arch: dict[str, str | bool] = {}
    i, n = 0, len(args)
    while i < n:
        tok = args[i]
        if tok == "--":
            kept.extend(args[i:])
            break
        flag, eq, val = tok.partition("=")
        takes = flag in NEUTRAL_VALUE or (flag in ARCH and not ARCH[flag].switch)
        if flag in NEUTRAL_SWITCHES or (flag in ARCH and ARCH[flag].switch):
            if eq:
                raise MeshplanError(f"Megatron-LM's {flag} is a switch: it takes no value (got {tok!r})", field=flag)
            if flag in ARCH:
                arch[flag] = True
            else:
                neutral.append(flag)
            i += 1
        elif takes:
            if not eq:
                if i + 1 >= n or args[i + 1].startswith("--"):
                    raise MeshplanError(f"Megatron-LM's {flag} needs a value", field=flag)
                val, i = args[i + 1], i + 1
            if flag in ARCH:
                arch[flag] = val
            else:
                neutral.append(f"{flag} {val}")
            i += 1
        elif flag in NEUTRAL_LIST:
            vals = [val] if eq else []
            i += 1
            while not eq and i < n and not args[i].startswith("--"):
                vals.append(args[i])
                i += 1
            neutral.append(" ".join([flag, *vals]))
        else:
            kept.append(tok)
            i += 1
    return kept, neutral, arch


def _differ(cfg: Any, given: str, ours: Any) -> MeshplanError:
    return MeshplanError(f"{given}: model {cfg.name} has {ours} (the architecture comes from "
                         f"--model; write a config.json to cost another)", field=given.split()[0])


def _by_default(cfg: Any, builds: str, ours: Any, add: str) -> MeshplanError:
    return MeshplanError(f"the launch line describes the model ({', '.join(DESCRIBING)}) and gives no "
                         f"{add}: Megatron-LM then builds {builds}, model {cfg.name} has {ours} (add "
                         f"{add}, or drop the architecture arguments)", field=add.split()[0])


def check(arch: dict[str, str | bool], cfg: Any, seq_len: int | None = None) -> None:
    """Check the architecture arguments against model config ``cfg`` (a
    ``completion.models.ModelConfig``) costed at ``seq_len`` tokens. Raises MeshplanError
    naming the argument, its value and the model's on a difference or an unreadable value.

    Megatron-LM's own rules: ``--num-query-groups`` (default 1) counts only with
    ``--group-query-attention``, without which the model is multi-head attention;
    ``--disable-bias-linear`` drops every linear's bias but the q/k/v one
    ``--add-qkv-bias`` keeps; ``--max-position-embeddings`` is at least the sequence and,
    with learned positions, the table's rows. When the line describes the model (one of
    :data:`DESCRIBING`), what it leaves out is Megatron-LM's default and must match too."""
    values: dict[str, Any] = {}
    for flag, given in arch.items():
        a = ARCH[flag]
        if a.switch:
            continue
        assert a.parse is not None
        try:
            values[flag] = a.parse(str(given))
        except ValueError as e:
            raise MeshplanError(f"Megatron-LM's {flag} {given!r}: not readable ({e})", field=flag) from None
    for flag in arch:
        ours = ARCH[flag].ours
        if ours is None:  # a rule of its own, below
            continue
        if flag in values and values[flag] != ours(cfg):
            raise _differ(cfg, f"{flag} {arch[flag]}", ours(cfg))
        says = ARCH[flag].says
        if flag not in values and not ours(cfg):
            raise _differ(cfg, flag, says(cfg) if says is not None else "it off")
    _check_attention(arch, values, cfg)
    _check_biases(arch, cfg)
    if seq_len is not None and "--max-position-embeddings" in values:
        mpe = values["--max-position-embeddings"]
        if mpe < seq_len:
            raise MeshplanError(f"--max-position-embeddings {mpe} is below the sequence, {seq_len} tokens "
                                "(Megatron-LM asserts max_position_embeddings >= seq_length)", field="--max-position-embeddings")
        if cfg.resolved_positions == "learned" and mpe != cfg.seq_len:
            raise _differ(cfg, f"--max-position-embeddings {mpe}", f"a learned position table of "
                                                                     f"{cfg.seq_len} rows")
    if any(f in arch for f in DESCRIBING):
        _check_defaults(arch, cfg)


def _check_attention(arch: dict[str, str | bool], values: dict[str, Any], cfg: Any) -> None:
    """Grouped-query attention: Megatron-LM's groups are ``--num-query-groups`` (1 when not
    given) under ``--group-query-attention``, else as many as heads."""
    if "--group-query-attention" in arch:
        groups = values.get("--num-query-groups", 1)
        if groups != cfg.num_kv_heads:
            given = f"--num-query-groups {groups}" if "--num-query-groups" in arch else \
                "--group-query-attention without --num-query-groups (1 key/value group)"
            raise _differ(cfg, given, f"{cfg.num_kv_heads} key/value heads")
    elif ("--num-attention-heads" in arch or "--num-query-groups" in arch) and cfg.num_kv_heads != cfg.num_heads:
        heads = arch.get("--num-attention-heads", cfg.num_heads)
        raise MeshplanError(f"--num-attention-heads {heads} without --group-query-attention: Megatron-LM "
                            f"builds {cfg.num_heads} key/value heads, model {cfg.name} has "
                            f"{cfg.num_kv_heads} (add --group-query-attention --num-query-groups "
                            f"{cfg.num_kv_heads})", field="--num-attention-heads")


def _check_biases(arch: dict[str, str | bool], cfg: Any) -> None:
    """``--disable-bias-linear`` (no bias on the output and MLP linears, nor on q/k/v unless
    ``--add-qkv-bias``); ``--add-qkv-bias`` alone (every bias on); nothing: checked only
    when the line describes the model (every bias on)."""
    ours = {w: cfg.bias(w) for w in ("qkv", "o", "mlp")}
    has = "biases on " + ", ".join(w for w, on in ours.items() if on) if any(ours.values()) \
        else "no linear biases"
    if "--disable-bias-linear" in arch:
        want = {"qkv": "--add-qkv-bias" in arch, "o": False, "mlp": False}
    elif "--add-qkv-bias" in arch or any(f in arch for f in DESCRIBING):
        want = {"qkv": True, "o": True, "mlp": True}
    else:
        return
    if want == ours:
        return
    given = " ".join(f for f in ("--disable-bias-linear", "--add-qkv-bias") if f in arch)
    if not given:
        raise _by_default(cfg, "biases on every linear layer", has, "--disable-bias-linear")
    raise _differ(cfg, given, has)


def _check_defaults(arch: dict[str, str | bool], cfg: Any) -> None:
    """What a describing launch line leaves out is Megatron-LM's default (:data:`DESCRIBING`)."""
    if "--swiglu" not in arch and "--squared-relu" not in arch and cfg.mlp_activation != "gelu":
        raise _by_default(cfg, "a gelu MLP", f"a {cfg.mlp_activation} MLP",
                          "--swiglu" if cfg.mlp_activation == "swiglu" else "its activation")
    if "--normalization" not in arch and cfg.resolved_norm != "layer_norm":
        raise _by_default(cfg, "LayerNorm", cfg.resolved_norm, "--normalization RMSNorm")
    rope = "--use-rotary-position-embeddings" in arch or "--position-embedding-type" in arch
    if not rope and cfg.resolved_positions != "learned":
        raise _by_default(cfg, "learned absolute positions", f"{cfg.resolved_positions} positions",
                          "--position-embedding-type rope")
    if "--untie-embeddings-and-output-weights" not in arch and not cfg.tie_word_embeddings:
        raise _by_default(cfg, "an output layer tied to the embedding", "an untied one",
                          "--untie-embeddings-and-output-weights")
    for flag, ours in (("--attention-dropout", cfg.attention_dropout), ("--hidden-dropout", cfg.hidden_dropout)):
        if flag not in arch and ours != 0.1:
            raise _by_default(cfg, f"{flag[2:].replace('-', ' ')} 0.1", ours, f"{flag} {ours:g}")
    if "--qk-layernorm" not in arch and cfg.qk_norm is not None:
        raise _by_default(cfg, "no q/k normalisation", "q/k normalisation", "--qk-layernorm")


def sequence_parallel(neutral: list[str], sp: bool, tp: int) -> bool:
    """``--sequence-parallel`` as Megatron-LM takes it: at tp 1 it turns it off with a warning
    (d98e8a64 ``arguments.py`` ``validate_args``; its Llama 3 and Mixtral example scripts pass
    it at tp 1), so it is costed off and named in :func:`finish`'s note (appended to
    ``neutral``, the launch line's cost-neutral arguments)."""
    if sp and tp == 1:
        neutral.append("--sequence-parallel (at tp 1 Megatron-LM turns it off)")
        return False
    return sp


def finish(arch: dict[str, str | bool], neutral: Sequence[str], source: Callable[[], Any]) -> list[str]:
    """After the model is known: check the launch line's architecture arguments ``arch``
    (:func:`split`'s) against ``source()`` (the ``completion.models.source.ModelSource``
    costed, read only when there are some; a .pir program has no config: refused) and
    return the note naming the cost-neutral ones ``neutral`` (empty when none). Raises
    MeshplanError naming the argument (``.field``) that differs from the model."""
    if arch:
        src = source()
        cfg = getattr(src, "config", None)
        if cfg is None:
            raise MeshplanError(f"{', '.join(arch)}: Megatron-LM architecture arguments describe a "
                                "model config; a .pir program is costed as written", field=next(iter(arch)))
        check(arch, cfg, getattr(src, "seq_len", None))
    if not neutral:
        return []
    return [f"Megatron-LM arguments that leave a step's cost alone, not read: {', '.join(neutral)}"]


__all__ = ["ARCH", "ArchArg", "COMMANDS", "DESCRIBING", "NEUTRAL_LIST", "NEUTRAL_SWITCHES",
           "NEUTRAL_VALUE", "check", "finish", "sequence_parallel", "split"]
