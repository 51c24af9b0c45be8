"""Keys of the cluster spec's dictionary fields are checked (found by a bad-input hunt: a
``device.peak_flops.bf61``, an ``attention_kernels.cudnx`` typo and a ``by_op.not_an_op``
were accepted and never read, the cost unchanged and no word said)."""

from __future__ import annotations

import copy
import typing

import pytest
import yaml

from clusters import load_cluster
from clusters.catalog import CATALOG_DIR
from clusters.errors import ClusterSpecError
from clusters.spec import ATTENTION_KERNELS, PEAK_FLOPS_DTYPES, parse_spec
from simulator.errors import SimulatorError
from simulator.profiles.spec import AttentionKernel
from simulator.roofline import _DTYPE_ALIASES, Roofline

BASE = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
Q = {"value": 0.5, "provenance": "test"}


def _with(path: str, key: str, value) -> dict:
    raw = copy.deepcopy(BASE)
    node = raw
    for p in path.split("."):
        node = node.setdefault(p, {})
    node[key] = value
    return raw


@pytest.mark.parametrize("path, key, value, what", [
    ("device.peak_flops", "bf61", {"value": 1e12, "provenance": "x"}, "unknown dtype(s) 'bf61'"),
    ("device.efficiency.attention_kernels", "cudnx", Q, "unknown attention kernel(s) 'cudnx'"),
    ("device.efficiency.by_op", "rms_norm:X", Q, "'rms_norm:X' must be 'op' or 'op:phase'"),
])
def test_an_unknown_key_is_refused_naming_the_field(path, key, value, what):
    with pytest.raises(ClusterSpecError) as e:
        parse_spec(_with(path, key, value), "cl.yaml")
    assert what in str(e.value) and path.split(".")[-1] in str(e.value)


def test_a_by_op_key_that_names_no_op_type_is_refused_when_costed():
    spec = parse_spec(_with("device.efficiency.by_op", "not_an_op", Q), "cl.yaml")
    with pytest.raises(SimulatorError, match="'not_an_op' name.s. no op type"):
        Roofline.from_device(spec.device)
    ok = parse_spec(_with("device.efficiency.by_op", "rms_norm_grad:W", Q), "cl.yaml")
    assert Roofline.from_device(ok.device).by_op == {"rms_norm_grad:W": 0.5}


def test_the_key_lists_agree_with_their_readers():
    """Every spelling the roofline looks up is a legal peak_flops key, and the attention
    kernels are the ones a framework profile can select."""
    looked_up = {a for aliases in _DTYPE_ALIASES.values() for a in aliases}
    assert looked_up <= set(PEAK_FLOPS_DTYPES)
    assert set(PEAK_FLOPS_DTYPES) - looked_up == {"int8"}
    assert set(typing.get_args(AttentionKernel.model_fields["value"].annotation)) == set(ATTENTION_KERNELS)


def test_every_catalog_cluster_still_loads():
    for f in sorted(CATALOG_DIR.glob("*.yaml")):
        Roofline.from_device(load_cluster(str(f)).spec.device)
