"""The cluster YAML's goodput sections, the profiles' checkpoint facts and the time-to-train
settings: defaults, overrides and bad input (issue 41)."""

from __future__ import annotations

import copy

import pytest
import yaml

from clusters.catalog import CATALOG_DIR
from clusters.errors import ClusterSpecError
from clusters.goodput_spec import goodput_sections, load_defaults
from clusters.spec import parse_spec
from simulator.goodput.plan import GoodputError, TrainSettings, save_mode
from simulator.profiles import load_profile

BASE = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())


def _with(section: str, value) -> dict:
    raw = copy.deepcopy(BASE)
    raw[section] = value
    return raw


def test_a_cluster_without_sections_takes_the_sourced_defaults():
    spec = parse_spec(BASE, "dgx-h100.yaml")
    sec = goodput_sections(spec)
    assert sec.defaulted == ("storage", "reliability", "jitter")
    assert sec.reliability is load_defaults().reliability
    for cause in sec.reliability.causes.values():
        assert "Llama 3" in cause.provenance


def test_a_cluster_section_replaces_the_default_whole():
    storage = {k: {"value": v, "provenance": "ours"} for k, v in (
        ("node_write_bandwidth", 1.0e+10), ("node_read_bandwidth", 2.0e+10),
        ("host_copy_bandwidth", 3.0e+10), ("save_overhead_s", 0.5))}
    sec = goodput_sections(parse_spec(_with("storage", storage), "mine.yaml"))
    assert sec.defaulted == ("reliability", "jitter")
    assert sec.storage.node_write_bandwidth.value == 1e10 and sec.storage.aggregate_write_bandwidth is None
    # the A100 catalog clusters state their PCIe 4.0 host link
    from clusters import load_cluster

    assert goodput_sections(load_cluster("dgx-a100-80g")).storage.host_copy_bandwidth.value == 2.5e10


@pytest.mark.parametrize("section, value, what", [
    ("storage", {"node_write_bandwidth": {"value": 400, "provenance": "x"}}, "storage.node_write_bandwidth"),
    ("reliability", {"causes": {"gpu": {"per_gpu_hour": 1e-6, "per_node_hour": 1e-6, "replaces_node": True,
                                        "provenance": "x"}},
                     "restart": {}}, "exactly one of per_gpu_hour and per_node_hour"),
    ("jitter", {"rank": {"dist": "uniform", "a": 0.2, "b": 0.1, "provenance": "x"},
                "kernel": {"dist": "none", "provenance": "x"}, "collective": {"dist": "none", "provenance": "x"}},
     "uniform needs a <= b"),
    ("jitter", {"rank": {"dist": "gamma", "a": 0.2, "provenance": "x"}}, "jitter.rank.dist"),
])
def test_a_bad_section_is_refused_naming_the_field(section, value, what):
    with pytest.raises(ClusterSpecError) as e:
        parse_spec(_with(section, value), "bad.yaml")
    assert what in str(e.value) and "bad.yaml" in str(e.value)


def test_profiles_state_how_they_save():
    mc = load_profile("megatron-core").checkpointing
    assert mc.async_save.value and mc.replicas.value == "balanced" and "Megatron-LM" in mc.async_save.provenance
    assert load_profile("nemo").checkpointing == mc  # inherited
    ds = load_profile("deepspeed").checkpointing
    assert not ds.async_save.value and ds.replicas.value == "first"
    assert save_mode("auto", load_profile("fsdp2")) == "async"
    assert save_mode("auto", load_profile("deepspeed")) == "sync"
    with pytest.raises(GoodputError, match="deepspeed profile saves synchronously .*TorchCheckpointEngine"):
        save_mode("async", load_profile("deepspeed"))
    assert load_profile("eager").checkpoint is None and not load_profile("eager").checkpointing.async_save.value


@pytest.mark.parametrize("bad, what", [
    ({"tokens": 0}, "tokens"), ({"tokens": float("nan")}, "tokens"), ({"mode": "fast"}, "checkpoint mode"),
    ({"interval": 0}, "checkpoint interval"), ({"spares": -1}, "spares"), ({"price": -2.0}, "price"),
])
def test_bad_train_settings_are_refused_naming_them(bad, what):
    with pytest.raises(GoodputError, match=what):
        TrainSettings(**{"tokens": 1e12, **bad})
