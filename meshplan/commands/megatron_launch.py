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
#: ctx.meta keys: the neutral arguments as typed, the architecture ones by flag
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
    "--data-cache-path", "--timing-log-level", "--max-position-embeddings", "--rotary-base",
    "--norm-epsilon",
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
    ``ours(cfg)`` the model's value in the argument's terms; ``says(cfg)``, for a switch,
    what the model has instead (the error's words)."""

    ours: Callable[[Any], Any]
    parse: Callable[[str], Any] | None = None
    says: Callable[[Any], str] | None = None

    @property
    def switch(self) -> bool:
        """True for an argument without a value (``store_true``)."""
        return self.parse is None


def _norm(v: str) -> str:
    names = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm"}
    if v not in names:
        raise ValueError(f"one of {', '.join(names)}")
    return names[v]


def _positions(v: str) -> str:
    names = {"rope": "rope", "learned_absolute": "learned"}
    if v not in names:
        raise ValueError(f"one of {', '.join(names)} (meshplan models these two)")
    return names[v]


#: architecture arguments -> how to read them and the model's value (``ModelConfig``)
ARCH: dict[str, ArchArg] = {
    "--hidden-size": ArchArg(lambda c: c.hidden_size, int),
    "--ffn-hidden-size": ArchArg(lambda c: c.ffn_hidden_size, int),
    "--num-attention-heads": ArchArg(lambda c: c.num_heads, int),
    "--num-query-groups": ArchArg(lambda c: c.num_kv_heads, int),
    "--group-query-attention": ArchArg(
        lambda c: c.num_kv_heads < c.num_heads, says=lambda c: f"as many key/value heads as heads ({c.num_heads})"),
    "--kv-channels": ArchArg(lambda c: c.head_dim, int),
    "--swiglu": ArchArg(lambda c: c.mlp_activation == "swiglu",
                        says=lambda c: f"a {c.mlp_activation} MLP"),
    "--squared-relu": ArchArg(lambda c: c.mlp_activation == "relu2",
                              says=lambda c: f"a {c.mlp_activation} MLP"),
    "--normalization": ArchArg(lambda c: c.resolved_norm, _norm),
    "--untie-embeddings-and-output-weights": ArchArg(
        lambda c: not c.tie_word_embeddings, says=lambda c: "its output layer tied to the embedding"),
    "--disable-bias-linear": ArchArg(lambda c: not any(c.bias(w) for w in ("qkv", "o", "mlp")),
                                     says=lambda c: "biases on its linear layers"),
    "--add-qkv-bias": ArchArg(lambda c: c.bias("qkv"), says=lambda c: "no q/k/v bias"),
    "--qk-layernorm": ArchArg(lambda c: c.qk_norm is not None, says=lambda c: "no q/k normalisation"),
    "--position-embedding-type": ArchArg(lambda c: c.resolved_positions, _positions),
    "--use-rotary-position-embeddings": ArchArg(
        lambda c: c.resolved_positions == "rope", says=lambda c: f"{c.resolved_positions} positions"),
    "--attention-dropout": ArchArg(lambda c: c.attention_dropout, float),
    "--hidden-dropout": ArchArg(lambda c: c.hidden_dropout, float),
    "--vocab-size": ArchArg(lambda c: c.vocab_size, int),
}


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
                raise MeshplanError(f"Megatron-LM's {flag} is a switch: it takes no value (got {tok!r})")
            if flag in ARCH:
                arch[flag] = True
            else:
                neutral.append(flag)
            i += 1
        elif takes:
            if not eq:
                if i + 1 >= n or args[i + 1].startswith("--"):
                    raise MeshplanError(f"Megatron-LM's {flag} needs a value")
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


def check(arch: dict[str, str | bool], cfg: Any) -> None:
    """Check the architecture arguments against model config ``cfg`` (a
    ``completion.models.ModelConfig``). Raises MeshplanError naming the argument, its value
    and the model's on a difference or an unreadable value. ``--num-query-groups`` counts
    only with ``--group-query-attention`` (Megatron-LM builds multi-head attention
    without it): given heads without the switch describe a model with as many key/value
    heads as heads."""
    def differ(flag: str, given: Any, ours: Any) -> MeshplanError:
        return MeshplanError(f"{flag}{'' if given is True else f' {given}'}: model {cfg.name} has "
                             f"{ours} (the architecture comes from --model; write a config.json "
                             f"to cost another)")

    for flag, given in arch.items():
        a = ARCH[flag]
        if flag == "--num-query-groups" and "--group-query-attention" not in arch:
            continue
        if a.switch:
            if not a.ours(cfg):
                raise differ(flag, True, a.says(cfg) if a.says is not None else "it off")
            continue
        assert a.parse is not None
        try:
            value = a.parse(str(given))
        except ValueError as e:
            raise MeshplanError(f"Megatron-LM's {flag} {given!r}: not readable ({e})") from None
        if value != a.ours(cfg):
            raise differ(flag, given, a.ours(cfg))
    if "--num-attention-heads" in arch and "--group-query-attention" not in arch \
            and cfg.num_kv_heads != cfg.num_heads:
        raise MeshplanError(f"--num-attention-heads {arch['--num-attention-heads']} without "
                            f"--group-query-attention: Megatron-LM builds {cfg.num_heads} key/value "
                            f"heads, model {cfg.name} has {cfg.num_kv_heads} (add "
                            f"--group-query-attention --num-query-groups {cfg.num_kv_heads})")


def finish(ctx: Any, config: Callable[[], Any]) -> list[str]:
    """After the model is known: check the launch line's architecture arguments against
    ``config()`` (the ``ModelConfig``, read only when there are some; None: a .pir program,
    which has no config: refused) and return the note naming the cost-neutral ones (empty
    when none)."""
    meta = getattr(ctx, "meta", {}) or {}
    arch, neutral = meta.get(ARCH_KEY) or {}, meta.get(NEUTRAL_KEY) or []
    if arch:
        cfg = config()
        if cfg is None:
            raise MeshplanError(f"{', '.join(arch)}: Megatron-LM architecture arguments describe a "
                                "model config; a .pir program is costed as written")
        check(arch, cfg)
    if not neutral:
        return []
    return [f"Megatron-LM arguments that leave a step's cost alone, not read: {', '.join(neutral)}"]


__all__ = ["ARCH", "ArchArg", "COMMANDS", "NEUTRAL_LIST", "NEUTRAL_SWITCHES", "NEUTRAL_VALUE",
           "check", "finish", "split"]
