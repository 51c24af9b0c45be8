"""Robustness of process meshes, dist attrs and HF configs: non-integers are refused
rather than truncated (2.5 -> 2), out-of-range coordinates raise, and config.json values
of the wrong type name the key (regressions found by a break-it review)."""

from __future__ import annotations

import json

import pytest

from completion import ProcessMesh, parse_program
from completion.dist_attr import Shard, TensorDistAttr, shard_range
from completion.errors import DistAttrError
from completion.models import load_hf_config
from completion.models.config import ModelConfigError

MESH = ProcessMesh.of(2, 4)


@pytest.mark.parametrize("shape", [(2.5, 2), (True, 4), None, "24"])
def test_mesh_shape_must_be_integers(shape):
    with pytest.raises(DistAttrError, match="process mesh shape"):
        ProcessMesh(shape, list(range(4)))


def test_mesh_ids_must_be_integers_and_names_distinct():
    with pytest.raises(DistAttrError, match="process_ids entry must be an integer, got 0.5"):
        ProcessMesh((2,), [0.5, 1])
    with pytest.raises(DistAttrError, match="repeat a name"):
        ProcessMesh((2, 2), [0, 1, 2, 3], ("dp", "dp"))


@pytest.mark.parametrize("coord", [(2, 0), (-1, 0), (0,), (0, 4)])
def test_rank_at_outside_the_mesh_raises(coord):
    with pytest.raises(DistAttrError, match="coordinate|mesh coordinate"):
        MESH.rank_at(coord)


def test_rank_at_inside_is_row_major():
    assert MESH.rank_at((1, 2)) == 1 * 4 + 2


@pytest.mark.parametrize("dm", [[0.7, -1], [float("inf"), -1], [float("nan")], ["a"], None, [True, -1]])
def test_dims_mapping_must_be_integers(dm):
    with pytest.raises(DistAttrError, match="dims_mapping"):
        TensorDistAttr(MESH, dm)


def test_partial_chunk_and_replace_are_checked():
    with pytest.raises(DistAttrError, match="partial mesh dim"):
        TensorDistAttr(MESH, [-1], {0.5: "sum"})
    with pytest.raises(DistAttrError, match="pairs"):
        TensorDistAttr(MESH, [-1], [1])
    with pytest.raises(DistAttrError, match="chunk_id must be >= 0"):
        TensorDistAttr(MESH, [-1], chunk_id=-1)
    with pytest.raises(DistAttrError, match="chunk_id must be an integer"):
        TensorDistAttr(MESH, [-1], chunk_id=1.7)
    with pytest.raises(DistAttrError, match="no field"):
        TensorDistAttr(MESH, [0, 1]).replace(foo=1)
    with pytest.raises(DistAttrError, match="Shard dim"):
        Shard(1.5)


def test_shard_range_checks_index_and_size():
    assert shard_range(5, 4, 3) == (5, 5)  # ceil chunks 2, 2, 1, 0 (torch.chunk)
    with pytest.raises(DistAttrError, match="index 3"):
        shard_range(10, 3, 3)
    with pytest.raises(DistAttrError, match="size -10"):
        shard_range(-10, 3, 0)


def test_pir_infinite_dims_mapping_names_the_line(shared_dir):
    text = (shared_dir / "data/programs/mlp_sgd_before_partition.pir").read_text()
    bad = text.replace("result(0):{dims_maping:[0,-1]}", "result(0):{dims_maping:[1e999,-1]}", 1)
    with pytest.raises(ValueError, match=r"line 3.*dims_mapping entry must be an integer, got inf"):
        parse_program(bad)


def _cfg(tmp_path, **extra):
    d = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
         "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 128,
         "max_position_embeddings": 16, **extra}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("extra, key", [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps"),
    ({"rms_norm_eps": -1e-5}, "rms_norm_eps"),
    ({"rope_theta": "big"}, "rope_theta"),
])
def test_hf_config_wrong_types_name_the_key(tmp_path, extra, key):
    with pytest.raises(ModelConfigError, match=f"config.json: '{key}'"):
        load_hf_config(_cfg(tmp_path, **extra))


def test_hf_config_valid_bool_and_floats_are_kept(tmp_path):
    cfg = load_hf_config(_cfg(tmp_path, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=5e5))
    assert (cfg.tie_word_embeddings, cfg.norm_eps, cfg.rope_theta) == (True, 1e-6, 5e5)
