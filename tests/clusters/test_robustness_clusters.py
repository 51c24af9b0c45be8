"""Robustness of cluster specs: booleans are not counts and absurd cluster sizes are
refused up front (they used to exhaust memory in ``meshplan clusters show``)."""

from __future__ import annotations

import copy

import pytest

from clusters import load_cluster
from clusters.catalog import CATALOG_DIR
from clusters.errors import ClusterError, ClusterSpecError
from clusters.spec import MAX_WORLD_SIZE, parse_spec
from meshplan.cli import main


def _raw() -> dict:
    import yaml

    return yaml.safe_load((CATALOG_DIR / "dgx-a100-80g.yaml").read_text())


def test_boolean_count_is_rejected_naming_the_field():
    raw = copy.deepcopy(_raw())
    raw["node"]["devices_per_node"]["value"] = True
    with pytest.raises(ClusterSpecError, match="node.devices_per_node.value.*boolean"):
        parse_spec(raw, "x.yaml")


def test_world_size_above_the_limit_is_rejected_in_the_spec():
    raw = copy.deepcopy(_raw())
    raw["cluster"]["num_nodes"]["value"] = MAX_WORLD_SIZE  # x 8 devices per node
    with pytest.raises(ClusterSpecError, match=r"x.yaml: cluster.num_nodes .* exceeds the limit"):
        parse_spec(raw, "x.yaml")


def test_nodes_override_above_the_limit_is_rejected():
    with pytest.raises(ClusterError, match="exceeds the limit of 1048576"):
        load_cluster("dgx-a100-80g", num_nodes=10**8)
    assert load_cluster("dgx-a100-80g", num_nodes=MAX_WORLD_SIZE // 8).world_size == MAX_WORLD_SIZE


def test_cli_show_huge_nodes_is_a_quick_error(capsys):
    assert main(["clusters", "show", "dgx-a100-80g", "--nodes", "100000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: num_nodes 100000000") and err.count("\n") == 1
