"""from_torch: torch.export on meta tensors -> Program (parameters, matmuls, opaque ops)."""

from __future__ import annotations

import sys
import warnings
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from completion import from_torch, parse_program, print_program
from completion.backward import append_backward
from completion.ir import OpRole


class Attention(nn.Module):
    def __init__(self, h: int, nh: int, nkv: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, h // nh
        self.q_proj = nn.Linear(h, nh * self.d, bias=False)
        self.k_proj = nn.Linear(h, nkv * self.d, bias=False)
        self.v_proj = nn.Linear(h, nkv * self.d, bias=False)
        self.o_proj = nn.Linear(nh * self.d, h, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nkv, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, h: int, nh: int, nkv: int, f: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(h)
        self.self_attn = Attention(h, nh, nkv)
        self.post_attention_layernorm = nn.RMSNorm(h)
        self.mlp = SwiGLU(h, f)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, vocab=256, h=64, nh=8, nkv=2, f=160, layers=2) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h, nh, nkv, f) for _ in range(layers))
        self.norm = nn.RMSNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)

    def forward(self, ids, labels):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def _inputs(b=2, s=16, vocab=256):
    return (torch.randint(0, vocab, (b, s)), torch.randint(0, vocab, (b, s)))


@pytest.fixture(scope="module")
def llama_capture():
    with torch.device("meta"):
        m = TinyLlama()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every op of this module must have a converter
        p = from_torch(m, _inputs())
    return m, p


def test_llama_parameters_and_matmuls_match_the_module(llama_capture):
    m, p = llama_capture
    assert p.num_parameters() == sum(x.numel() for x in m.parameters())
    # by hand: embed 256*64 + 2 * (norms 2*64 + q,o 2*64*64 + k,v 2*64*16 + mlp 3*64*160)
    # + final norm 64 + lm_head 64*256
    assert p.num_parameters() == 16384 + 2 * (128 + 8192 + 2048 + 30720) + 64 + 16384 == 115_008
    n_linear = sum(isinstance(x, nn.Linear) for x in m.modules())  # each is called once
    assert n_linear == 2 * 7 + 1
    types = Counter(op.type for op in p.ops)
    assert types["matmul"] == n_linear
    assert types["flash_attention"] == 2 and types["rms_norm"] == 5 and types["embedding"] == 1
    assert all(x.device.type == "meta" for x in m.parameters())  # nothing was allocated


def test_llama_capture_names_shapes_and_loss(llama_capture):
    m, p = llama_capture
    params = {v.name: v.shape for v in p.parameters()}
    assert params == {n: tuple(x.shape) for n, x in m.named_parameters()}
    up = [op for op in p.ops if op.type == "matmul" and op.struct_name == "layers.1.mlp.up_proj"]
    assert len(up) == 1 and up[0].attrs["transpose_y"] is True
    assert up[0].results[0].shape == (2, 16, 160)
    fa = next(op for op in p.ops if op.type == "flash_attention")
    assert [v.shape for v in fa.operands] == [(2, 16, 8, 8), (2, 16, 2, 8), (2, 16, 2, 8)]
    assert fa.attrs["causal"] is True
    out = p.ops[-1]
    assert out.type == "shadow_output" and out.attrs["output_name"] == "loss_0"
    assert out.role == OpRole.LOSS and out.operands[0].shape == ()
    assert [op.type for op in p.ops if op.role == OpRole.LOSS] == [
        "unsqueeze", "cross_entropy_with_softmax", "mean", "shadow_output"]


def test_captured_program_differentiates_and_round_trips(llama_capture):
    _, p = llama_capture
    text = print_program(p)
    q = parse_program(text)
    assert print_program(q) == text
    pairs = append_backward(q)
    assert len(pairs) == len(q.parameters())
    assert all(g.type == w.type for w, g in pairs)


class WithUnknownOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cumsum(self.proj(x), dim=-1).sum()


def test_unknown_aten_op_becomes_opaque_with_a_warning():
    with pytest.warns(UserWarning, match="aten.cumsum"):
        p = from_torch(WithUnknownOp(), (torch.randn(4, 8),))
    opq = [op for op in p.ops if op.type == "opaque"]
    assert len(opq) == 1 and opq[0].attrs["source_op"] == "aten.cumsum"
    assert opq[0].results[0].shape == (4, 8) and opq[0].operands[0].shape == (4, 8)
    assert [op.type for op in p.ops if op.role != OpRole.LOSS][-3:] == ["add", "opaque", "sum"]
    assert p.num_parameters() == 8 * 8 + 8
    text = print_program(p)
    assert print_program(parse_program(text)) == text


class TinyGPT(nn.Module):
    """GPT-style: learned positions, layer_norm, GeLU MLP with biases, tied head."""

    def __init__(self, vocab=128, s=16, h=32) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(s, h)
        self.ln = nn.LayerNorm(h)
        self.fc, self.proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, ids, pos):
        x = self.wte(ids) + self.wpe(pos)
        x = x + self.proj(F.gelu(self.fc(self.ln(x))))
        return x @ self.wte.weight.t()


def test_gpt_style_module_with_real_weights_and_tied_head():
    m = TinyGPT()
    ids = torch.randint(0, 128, (2, 16))
    pos = torch.arange(16).expand(2, 16)
    p = from_torch(m, (ids, pos))
    assert p.num_parameters() == sum(x.numel() for x in m.parameters())
    types = Counter(op.type for op in p.ops)
    assert types["layer_norm"] == 1 and types["gelu"] == 1 and types["embedding"] == 2
    assert types["matmul"] == 3 and "opaque" not in types
    out = p.ops[-1]
    assert out.attrs["output_name"] == "output_0" and out.operands[0].shape == (2, 16, 128)


def test_missing_torch_gives_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="pip install"):
        from_torch(object(), ())
