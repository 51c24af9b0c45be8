"""Rank placement (node-major) and rank-group classification."""

from __future__ import annotations

import pytest

from clusters import CollectiveError, load_cluster


@pytest.fixture(scope="module")
def c4():
    return load_cluster("dgx-a100-80g", num_nodes=4)


def test_node_and_local_index(c4):
    assert c4.world_size == 32 and c4.devices_per_node == 8
    assert [c4.node_of(r) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]
    assert [c4.local_index(r) for r in (0, 7, 8, 31)] == [0, 7, 0, 7]


def test_classify_single_node(c4):
    g = c4.group(range(8, 16))
    assert g.single_node and not g.spans_nodes and g.nodes == (1,)
    assert g.max_ranks_per_node == 8 and g.describe() == "8 ranks on 1 node"


def test_classify_spanning_uniform(c4):
    g = c4.group([0, 8, 16, 24])
    assert g.spans_nodes and g.num_nodes == 4 and g.uniform
    assert g.ranks_per_node == {0: 1, 1: 1, 2: 1, 3: 1}
    assert g.describe() == "4 ranks on 4 nodes, 1 per node"


def test_classify_non_uniform(c4):
    g = c4.group([9, 0, 1, 2])
    assert g.ranks == (9, 0, 1, 2)
    assert g.per_node == ((0, (0, 1, 2)), (1, (9,)))
    assert not g.uniform and (g.min_ranks_per_node, g.max_ranks_per_node) == (1, 3)
    assert g.describe() == "4 ranks on 2 nodes, 1..3 per node"


def test_rank_errors(c4):
    with pytest.raises(
        CollectiveError, match=r"rank 32 is outside cluster 'dgx-a100-80g' \(world_size 32"
    ):
        c4.group([0, 32])
    with pytest.raises(CollectiveError, match="rank -1 is outside"):
        c4.node_of(-1)
    with pytest.raises(CollectiveError, match=r"duplicate rank 3 in group \[3, 4, 3\]"):
        c4.group([3, 4, 3])
    with pytest.raises(CollectiveError, match="empty group"):
        c4.group([])
    with pytest.raises(CollectiveError, match="rank '1' is not an int"):
        c4.group(["1"])
    with pytest.raises(CollectiveError, match="rank True is not an int"):
        c4.local_index(True)
