"""Executor kernels: every *_grad kernel against torch.autograd on its forward kernel
(float64), forward kernels against torch.nn.functional, optimizers against torch.optim."""

from __future__ import annotations

import math

import pytest
import torch

import completion.ops  # noqa: F401  (registers the op declarations)
from completion.ops.declare import GRAD_SUFFIX, base_name
from completion.ops.registry import OP_REGISTRY, get_opdef
from executor.kernels import KERNELS, KernelContext, KernelError, get_kernel
from executor.kernels.attention import rope_tables

D = torch.float64


def rnd(*shape, lo=None):
    g = torch.randn(*shape, dtype=D)
    return g.abs() + lo if lo is not None else g


def ints(hi, *shape):
    return torch.randint(0, hi, shape)


S, C = rope_tables(5, 8, 10000.0, True, dtype=D)
S2, C2 = rope_tables(5, 8, 10000.0, False, dtype=D)

# (forward op, operand factory, attrs); each case checks the op's grad kernel.
CASES = [
    ("add", lambda: [rnd(3, 4, 5), rnd(5)], {}),
    ("add", lambda: [rnd(3, 1, 5), rnd(4, 1)], {}),
    ("subtract", lambda: [rnd(3, 4), rnd(3, 4)], {}),
    ("multiply", lambda: [rnd(2, 3, 4), rnd(3, 1)], {}),
    ("divide", lambda: [rnd(3, 4), rnd(4, lo=0.5)], {}),
    ("relu", lambda: [rnd(4, 5)], {}),
    ("tanh", lambda: [rnd(4, 5)], {}),
    ("sigmoid", lambda: [rnd(4, 5)], {}),
    ("exp", lambda: [rnd(4, 5)], {}),
    ("square", lambda: [rnd(4, 5)], {}),
    ("silu", lambda: [rnd(4, 5)], {}),
    ("gelu", lambda: [rnd(4, 5)], {"approximate": False}),
    ("gelu", lambda: [rnd(4, 5)], {"approximate": True}),
    ("cast", lambda: [rnd(4, 5)], {"dtype": "float64"}),
    ("scale", lambda: [rnd(4, 5), None], {"scale": 2.5, "bias": 0.3, "bias_after_scale": True}),
    ("dropout", lambda: [rnd(6, 7), None], {"p": 0.3, "seed": 7, "mode": "upscale_in_train"}),
    ("matmul", lambda: [rnd(3, 4), rnd(4, 5)], {}),
    ("matmul", lambda: [rnd(4, 3), rnd(5, 4)], {"transpose_x": True, "transpose_y": True}),
    ("matmul", lambda: [rnd(2, 3, 4, 5), rnd(5, 6)], {}),
    ("matmul", lambda: [rnd(2, 3, 5, 4), rnd(6, 5)], {"transpose_x": True, "transpose_y": True}),
    ("matmul", lambda: [rnd(2, 1, 3, 4), rnd(5, 4, 6)], {}),
    ("matmul", lambda: [rnd(3, 4), rnd(4)], {}),
    ("softmax", lambda: [rnd(3, 4, 5)], {"axis": -1}),
    ("softmax", lambda: [rnd(3, 4, 5)], {"axis": 1}),
    ("log_softmax", lambda: [rnd(3, 4, 5)], {"axis": -1}),
    ("layer_norm", lambda: [rnd(2, 3, 8), rnd(8), rnd(8)], {"epsilon": 1e-5, "begin_norm_axis": 2}),
    ("layer_norm", lambda: [rnd(2, 3, 4), rnd(12), None], {"epsilon": 1e-5, "begin_norm_axis": 1}),
    ("rms_norm", lambda: [rnd(2, 3, 8), rnd(8)], {"epsilon": 1e-6, "begin_norm_axis": 2}),
    ("embedding", lambda: [ints(10, 2, 3), rnd(10, 4)], {"padding_idx": -1}),
    ("embedding", lambda: [ints(10, 2, 3), rnd(10, 4)], {"padding_idx": 2}),
    ("swiglu", lambda: [rnd(3, 6), rnd(3, 6)], {}),
    ("swiglu", lambda: [rnd(3, 6), None], {}),
    ("flash_attention", lambda: [rnd(2, 5, 4, 8), rnd(2, 5, 2, 8), rnd(2, 5, 2, 8)], {"causal": True}),
    ("flash_attention", lambda: [rnd(2, 3, 2, 8), rnd(2, 5, 2, 8), rnd(2, 5, 2, 8)], {"causal": True}),
    ("flash_attention", lambda: [rnd(1, 4, 2, 8), rnd(1, 6, 1, 8), rnd(1, 6, 1, 8)], {"causal": False}),
    # issue 42: v of its own head size (MLA), sinks (GPT-OSS), an attention chunk (Llama 4)
    ("flash_attention", lambda: [rnd(2, 6, 4, 8), rnd(2, 6, 2, 8), rnd(2, 6, 2, 5), rnd(4)],
     {"causal": True, "attention_chunk": 4}),
    ("fused_rotary_position_embedding",
     lambda: [rnd(2, 5, 4, 8), rnd(2, 5, 2, 8), None, S, C, None], {"use_neox_rotary_style": True}),
    ("fused_rotary_position_embedding",
     lambda: [rnd(2, 5, 4, 8), None, rnd(2, 5, 4, 8), S2, C2, None], {"use_neox_rotary_style": False}),
    ("fused_rotary_position_embedding",
     lambda: [rnd(2, 3, 2, 8), rnd(2, 3, 2, 8), None, S, C, ints(5, 2, 3)], {"use_neox_rotary_style": True}),
    ("cross_entropy_with_softmax",
     lambda: [rnd(2, 3, 7), torch.tensor([[[1], [6], [-100]], [[0], [3], [2]]])], {"ignore_index": -100}),
    ("cross_entropy_with_softmax",
     lambda: [rnd(4, 7), torch.softmax(rnd(4, 7), -1)], {"soft_label": True}),
    ("reshape", lambda: [rnd(2, 3, 4)], {"shape": [0, -1]}),
    ("transpose", lambda: [rnd(2, 3, 4)], {"perm": [2, 0, 1]}),
    ("split", lambda: [rnd(2, 6, 3)], {"axis": 1, "num_or_sections": [2, -1, 1]}),
    ("concat", lambda: [rnd(2, 3), rnd(4, 3), rnd(1, 3)], {"axis": 0}),
    ("expand", lambda: [rnd(2, 1, 3)], {"shape": [4, 2, 5, 3]}),
    ("moe_topk", lambda: [rnd(2, 5, 8, lo=0.1)], {"k": 2, "normalize": True, "scale": 2.5, "groups": 4,
                                                 "topk_groups": 2}),
    ("slice", lambda: [rnd(4, 6, 3)], {"axes": [0, 1], "starts": [1, -4], "ends": [3, 100], "decrease_axis": []}),
    ("slice", lambda: [rnd(4, 6)], {"axes": [0], "starts": [2], "ends": [3], "decrease_axis": [0]}),
    ("squeeze", lambda: [rnd(2, 1, 3, 1)], {"axis": [1]}),
    ("unsqueeze", lambda: [rnd(2, 3)], {"axis": [0, -1]}),
    ("sum", lambda: [rnd(2, 3, 4)], {"axis": [1], "keepdim": False}),
    ("sum", lambda: [rnd(2, 3, 4)], {"axis": [], "keepdim": False}),
    ("mean", lambda: [rnd(2, 3, 4)], {"axis": [0, 2], "keepdim": True}),
    ("mean", lambda: [rnd(4, 8)], {"axis": [], "keepdim": False}),
    ("max", lambda: [rnd(3, 5)], {"axis": [1], "keepdim": False}),
    # mixture of experts (completion.ops.moe): 3 experts, top-2 of 5 tokens: capacity
    # ceil(5 * 2 / 3) = 4 slots per sequence, so skewed routings drop pairs (capacity
    # factor 2: ceil(20 / 3) = 7 slots, every pair to expert 0 drops 3 of 10)
    ("moe_topk", lambda: [rnd(2, 5, 6, lo=0.1)], {"k": 2, "normalize": True}),
    ("moe_topk", lambda: [rnd(2, 5, 6, lo=0.1)], {"k": 3, "normalize": False}),
    ("moe_dispatch", lambda: [rnd(2, 5, 4), ints(3, 2, 5, 2)], {"num_experts": 3}),
    ("moe_combine", lambda: [rnd(3, 8, 4), rnd(2, 5, 2), ints(3, 2, 5, 2)], {"num_experts": 3}),
    ("moe_combine", lambda: [rnd(3, 14, 4), rnd(2, 5, 2), torch.zeros(2, 5, 2, dtype=torch.long)],
     {"num_experts": 3, "capacity_factor": 2.0}),
    ("moe_aux_loss", lambda: [rnd(2, 5, 4), torch.softmax(rnd(2, 5, 3), -1), ints(3, 2, 5, 2)],
     {"coef": 0.01}),
]


# operands the declarations give no gradient (rotary sin/cos tables)
NO_GRAD = {"fused_rotary_position_embedding": {3, 4, 5}, "cross_entropy_with_softmax": {1},
           # the aux loss's own gradient on probs is not the autograd of its outputs (it is
           # injected, Megatron-Core's MoEAuxLossAutoScaler): tests/completion/test_models_moe.py checks it
           "moe_aux_loss": {1}}


def _is_float(t) -> bool:
    return t is not None and t.is_floating_point()


def _grad_operands(fdef, ins, outs, cots):
    """The grad op's operands, assembled by name from the forward declaration."""
    fops = [base_name(o) for o in fdef.operands]
    fres = [base_name(r) for r in fdef.results]
    args = []
    for g in fdef.grad_inputs:
        nm = base_name(g)
        if g.endswith(GRAD_SUFFIX):
            vals = cots if (fdef.variadic_results and nm == fres[-1]) else [cots[fres.index(nm)]]
        elif nm in fops:
            if not fdef.variadic and fops.index(nm) >= len(ins):
                continue  # a trailing optional operand the op leaves out (completion.backward)
            vals = ins if (fdef.variadic and nm == fops[-1]) else [ins[fops.index(nm)]]
        else:
            vals = [outs[fres.index(nm)]]
        args.extend(v.detach() if isinstance(v, torch.Tensor) else v for v in vals)
    return args


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}-{i}")
def test_grad_kernel_matches_autograd(case):
    torch.manual_seed(case)
    name, make, attrs = CASES[case]
    fdef = get_opdef(name)
    attrs = {**fdef.attrs, **attrs}
    ins = make()
    skip = NO_GRAD.get(name, set())
    ins = [t.clone().requires_grad_(True) if _is_float(t) and i not in skip else t
           for i, t in enumerate(ins)]
    outs = get_kernel(name)(ins, attrs, KernelContext())
    grad_names = {base_name(g) for g in fdef.grad_inputs if g.endswith(GRAD_SUFFIX)}
    fres = [base_name(r) for r in fdef.results]
    cots = []
    for i, o in enumerate(outs):
        takes = (fdef.variadic_results and i >= len(fres) - 1) or (i < len(fres) and fres[i] in grad_names)
        cots.append(torch.randn_like(o) if takes and _is_float(o) else None)
    pairs = [(o, c) for o, c in zip(outs, cots, strict=True) if c is not None]
    diff = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
    want = torch.autograd.grad([o for o, _ in pairs], diff, [c for _, c in pairs], allow_unused=True)
    got = get_kernel(fdef.grad)(_grad_operands(fdef, ins, outs, cots), attrs, KernelContext())
    want_iter = iter(want)
    checked = 0
    for i, t in enumerate(ins):
        if not (isinstance(t, torch.Tensor) and t.requires_grad):
            continue
        w = next(want_iter)
        w = torch.zeros_like(t) if w is None else w
        assert got[i] is not None, f"{fdef.grad}: no gradient for operand {i}"
        torch.testing.assert_close(got[i], w, rtol=1e-9, atol=1e-10)
        checked += 1
    assert checked >= 1


def test_every_op_with_a_grad_is_covered():
    covered = {c[0] for c in CASES}
    with_grad = {n for n, od in OP_REGISTRY.items() if od.grad and od.grad != "reshard"}
    assert with_grad <= covered, sorted(with_grad - covered)


def test_every_program_op_has_a_kernel():
    executor_handles = {"parameter", "reshard", "opaque", "send", "recv",
                        "all_reduce", "reduce_scatter", "all_gather", "all_to_all"}
    missing = set(OP_REGISTRY) - set(KERNELS) - executor_handles
    assert not missing, sorted(missing)


def test_unknown_op_raises_kernel_error():
    with pytest.raises(KernelError, match="no torch kernel for op type 'nonsense'"):
        get_kernel("nonsense")


# -- forward kernels against torch.nn.functional ------------------------------------------

def _k(name, ins, attrs=None, ctx=None):
    return get_kernel(name)(ins, {**get_opdef(name).attrs, **(attrs or {})}, ctx or KernelContext())


def test_layer_norm_and_rms_norm_forward():
    x, w, b = rnd(2, 3, 8), rnd(8), rnd(8)
    out, mean, var = _k("layer_norm", [x, w, b], {"begin_norm_axis": 2, "epsilon": 1e-5})
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5))
    torch.testing.assert_close(mean, x.reshape(6, 8).mean(1))
    out, inv = _k("rms_norm", [x, w], {"begin_norm_axis": 2, "epsilon": 1e-6})
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (8,), w, 1e-6))


def test_flash_attention_forward_matches_sdpa_with_gqa():
    q, k, v = rnd(2, 5, 4, 8), rnd(2, 5, 2, 8), rnd(2, 5, 2, 8)
    out, sm, lse, seed = _k("flash_attention", [q, k, v], {"causal": True})
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2),
        v.repeat_interleave(2, 2).transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    assert sm is None and lse.shape == (2, 4, 5) and seed.shape == (2,)


def test_cross_entropy_forward_matches_torch():
    x, lab = rnd(6, 7), ints(7, 6, 1)
    sm, loss = _k("cross_entropy_with_softmax", [x, lab])
    torch.testing.assert_close(loss[:, 0], torch.nn.functional.cross_entropy(x, lab[:, 0], reduction="none"))
    torch.testing.assert_close(sm, torch.softmax(x, -1))


def test_rope_matches_complex_rotation():
    q = rnd(1, 5, 1, 8)
    (out, _, _) = _k("fused_rotary_position_embedding", [q, None, None, S, C, None])
    inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=D) / 8)
    ang = torch.arange(5, dtype=D)[:, None] * inv
    z = torch.complex(q[0, :, 0, 0::2], q[0, :, 0, 1::2]) * torch.exp(1j * ang)
    torch.testing.assert_close(out[0, :, 0, 0::2], z.real)
    torch.testing.assert_close(out[0, :, 0, 1::2], z.imag)


def test_vocab_parallel_embedding_shards_sum_to_full_lookup():
    ids, w = ints(10, 3, 4), rnd(10, 5)
    full = _k("embedding", [ids, w])[0]
    torch.testing.assert_close(full, torch.nn.functional.embedding(ids, w))
    parts = [_k("embedding", [ids, w[a:b]], ctx=KernelContext(in_offsets=(None, (a, 0))))[0]
             for a, b in ((0, 5), (5, 10))]
    torch.testing.assert_close(parts[0] + parts[1], full)
    g = rnd(3, 4, 5)
    dw = [_k("embedding_grad", [ids, w[a:b], g], ctx=KernelContext(in_offsets=(None, (a, 0))))[1]
          for a, b in ((0, 5), (5, 10))]
    torch.testing.assert_close(torch.cat(dw), _k("embedding_grad", [ids, w, g])[1])


def test_reshape_uses_local_result_shape():
    from completion.ops.registry import TensorType

    x = rnd(2, 6)
    ctx = KernelContext(out_types=(TensorType((2, 3, 2), "float64"),))
    assert _k("reshape", [x], {"shape": [4, 3, 2]}, ctx)[0].shape == (2, 3, 2)


# -- optimizers against torch.optim --------------------------------------------------------

def _run_opt(kind, steps=3, lr=0.05, **hp):
    torch.manual_seed(0)
    p0 = rnd(4, 3)
    grads = [rnd(4, 3) for _ in range(steps)]
    ref = p0.clone().requires_grad_(True)
    opt = {"sgd": lambda: torch.optim.SGD([ref], lr=lr),
           "adam": lambda: torch.optim.Adam([ref], lr=lr, betas=(0.9, 0.99), eps=1e-8),
           "adamw": lambda: torch.optim.AdamW([ref], lr=lr, betas=(0.9, 0.99), eps=1e-8,
                                              weight_decay=hp.get("coeff", 0.1))}[kind]()
    p = p0.clone()
    lr_t = torch.tensor(lr, dtype=D)
    m1, m2 = torch.zeros_like(p), torch.zeros_like(p)
    b1p, b2p = torch.tensor([0.9], dtype=D), torch.tensor([0.99], dtype=D)
    for g in grads:
        ref.grad = g.clone()
        opt.step()
        if kind == "sgd":
            _k("sgd_", [p, lr_t, g, None])
        else:
            attrs = {"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, **hp}
            _k(f"{kind}_", [p, g, lr_t, m1, m2, b1p, b2p, None, None], attrs)
        torch.testing.assert_close(p, ref.detach(), rtol=1e-12, atol=1e-12)
    assert not torch.equal(p, p0)
    return b1p


def test_sgd_matches_torch():
    _run_opt("sgd")


def test_adam_matches_torch_and_advances_beta_powers():
    b1p = _run_opt("adam")
    assert math.isclose(float(b1p), 0.9 ** 4)


def test_adamw_matches_torch():
    _run_opt("adamw", coeff=0.1)


def test_matmul_grad_computes_only_the_wanted_part():
    x, y, g = rnd(3, 4), rnd(4, 5), rnd(3, 5)
    full = _k("matmul_grad", [x, y, g])
    b = _k("matmul_grad", [x, y, g], ctx=KernelContext(want=(0,)))
    w = _k("matmul_grad", [x, y, g], ctx=KernelContext(want=(1,)))
    assert b[1] is None and w[0] is None
    torch.testing.assert_close(b[0], full[0])
    torch.testing.assert_close(w[1], full[1])


def test_local_reshard_kernels_uneven_split():
    from completion.ops.registry import TensorType

    x = rnd(5, 3)
    rows = [_k("local_slice", [x], {"dst_dim": 0}, KernelContext(group=(4, 9), rank=r))[0]
            for r in (4, 9)]
    assert rows[0].shape == (3, 3) and rows[1].shape == (2, 3)
    ctx = lambda r: KernelContext(out_types=(TensorType((5, 3), "float64"),), group=(4, 9), rank=r)  # noqa: E731
    parts = [_k("zero_fill", [rows[i]], {"src_dim": 0}, ctx(r))[0] for i, r in enumerate((4, 9))]
    torch.testing.assert_close(parts[0] + parts[1], x)
    assert torch.count_nonzero(parts[1][:3]) == 0
    rep = [_k("zero_fill", [x], {"src_dim": -1}, ctx(r))[0] for r in (4, 9)]
    torch.testing.assert_close(rep[0], x)
    assert torch.count_nonzero(rep[1]) == 0
    torch.testing.assert_close(_k("local_scale", [x], {"factor": 0.5})[0], x / 2)


def test_mean_grad_of_a_batch_shard_uses_the_global_count():
    x, g = rnd(2, 8), torch.tensor(1.0, dtype=D)
    ctx = KernelContext(in_global=((4, 8), None))
    torch.testing.assert_close(_k("mean_grad", [x, g], ctx=ctx)[0], torch.full((2, 8), 1 / 32, dtype=D))
