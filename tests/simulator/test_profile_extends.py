"""``extends:`` in framework profile YAML (simulator/profiles/spec.py docstring,
simulator/profiles/inherit.py, loader.py) and the catalog's one list of names
(completion.strategy.FRAMEWORKS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator.profiles as profiles
from completion.strategy import FRAMEWORKS
from simulator.profiles import (
    CATALOG_DIR,
    ProfileError,
    ProfileSpec,
    check_catalog,
    list_profiles,
    load_profile,
    load_profile_file,
    parse_profile,
)

FSDP2 = yaml.safe_load((CATALOG_DIR / "fsdp2.yaml").read_text())


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _leaves(data: dict, prefix: str = "") -> dict[str, Any]:
    """dotted path -> value of every leaf of a raw profile mapping: a mapping with a
    ``value`` key is one leaf (a {value, provenance} pair), as is a plain scalar. An
    implementation independent of the schema walk of simulator.profiles.inherit."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and "value" not in value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _unflatten(leaves: dict[str, Any]) -> dict:
    out: dict = {}
    for dotted, value in leaves.items():
        *path, last = dotted.split(".")
        node = out
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def _differing(a: ProfileSpec, b: ProfileSpec) -> set[str]:
    """Dotted fields (down to a {value, provenance} pair) where two profiles differ."""
    la, lb = _leaves(a.model_dump(mode="json")), _leaves(b.model_dump(mode="json"))
    return {k for k in la.keys() | lb.keys() if la.get(k) != lb.get(k)}


# (a) a child overrides one nested field and inherits the rest


def test_child_file_overrides_one_nested_pair_and_inherits_the_rest(tmp_path):
    _write(tmp_path / "base.yaml", {**FSDP2, "name": "base"})
    _write(tmp_path / "child.yaml", {"extends": "base.yaml", "name": "child", "overlap": {
        "fsdp_prefetch": {"value": 2, "provenance": "test: two blocks ahead"}}})
    base, child = load_profile_file(tmp_path / "base.yaml"), load_profile_file(tmp_path / "child.yaml")
    assert child.overlap.fsdp_prefetch.value == 2
    assert child.overlap.fsdp_prefetch.provenance == "test: two blocks ahead"
    assert base.overlap.fsdp_prefetch.value == 1
    # the other six fields of the overlap section and every other section are the parent's
    assert child.overlap.tp_backward == base.overlap.tp_backward
    assert child.overlap.comm_sms == base.overlap.comm_sms
    assert child.memory == base.memory and child.kernels == base.kernels
    assert _differing(base, child) == {"name", "overlap.fsdp_prefetch"}
    # the description is an ordinary field: inherited
    assert child.description == base.description != ""


def test_chain_of_two_parents_and_a_catalog_parent(tmp_path):
    """grandchild.yaml -> child.yaml -> fsdp2 (catalog name): the nearest statement wins."""
    _write(tmp_path / "child.yaml", {"extends": "fsdp2", "name": "child", "memory": {
        "fragmentation": {"value": 0.1, "provenance": "child"}}})
    _write(tmp_path / "grandchild.yaml", {"extends": "child.yaml", "name": "grandchild", "memory": {
        "workspace_bytes": {"value": 1.0, "provenance": "grandchild"}}})
    got = load_profile(tmp_path / "grandchild.yaml")
    assert (got.memory.fragmentation.value, got.memory.workspace_bytes.value) == (0.1, 1.0)
    assert got.memory.cuda_context_bytes.value == 6.0e8  # fsdp2.yaml
    assert _differing(load_profile("fsdp2"), got) == {
        "name", "memory.fragmentation", "memory.workspace_bytes"}


def test_a_pair_is_replaced_whole_and_an_optional_field_can_be_cleared():
    """A child value without its provenance is refused (the parent's provenance would no
    longer describe the value); ``null`` clears an optional field."""
    with pytest.raises(ProfileError, match=r"<mine>: missing field 'overlap.fsdp_prefetch.provenance'"):
        parse_profile({"extends": "fsdp2", "name": "x", "overlap": {"fsdp_prefetch": {"value": 2}}},
                      "<mine>")
    cleared = parse_profile({"extends": "fsdp2", "name": "x", "kernels": {"cp_attention": None}})
    assert cleared.kernels.cp_attention is None
    inherited = load_profile("fsdp2").kernels.cp_attention
    assert inherited is not None and inherited.value == "torchtitan-sdpa"


def test_a_typo_inside_a_pair_is_still_refused_by_the_schema(tmp_path):
    child = _write(tmp_path / "child.yaml", {"extends": "fsdp2", "name": "c", "overlap": {
        "tp_forward": {"value": True, "provenence": "typo"}}})
    with pytest.raises(ProfileError, match=r"child\.yaml: missing field 'overlap.tp_forward.provenance'"):
        load_profile_file(child)
    _write(child, {"extends": "fsdp2", "name": "c", "overlap": {
        "tp_forward": {"value": True, "provenance": "p", "provenence": "typo"}}})
    with pytest.raises(ProfileError, match=r"child\.yaml: unknown field 'overlap.tp_forward.provenence'"):
        load_profile_file(child)


_PAIRS = sorted(k for k, v in _leaves(FSDP2).items() if isinstance(v, dict))


@settings(max_examples=25, deadline=None)
@given(path=st.sampled_from(_PAIRS), provenance=st.text(min_size=1, max_size=20))
def test_restating_any_pair_changes_that_pair_only(path, provenance):
    """Property: a child that restates any one {value, provenance} pair of fsdp2 (the same
    value, its own provenance) differs from fsdp2 in that pair's provenance and its name."""
    value = _leaves(FSDP2)[path]["value"]
    child = parse_profile({"extends": "fsdp2", "name": "x",
                           **_unflatten({path: {"value": value, "provenance": provenance}})})
    parent = load_profile("fsdp2")
    assert _differing(parent, child) == ({"name", path} if provenance != _leaves(FSDP2)[path]["provenance"]
                                         else {"name"})
    assert _leaves(child.model_dump(mode="json"))[path]["provenance"] == provenance


# (b) errors name the file and the field or parent at fault


def test_unknown_parent_names_the_file_and_the_parent(tmp_path):
    child = _write(tmp_path / "child.yaml", {"extends": "fsdp3", "name": "c"})
    with pytest.raises(ProfileError, match=r"child\.yaml: field 'extends': unknown parent profile "
                                           r"'fsdp3' \(not in the catalog: deepspeed, deepspeed-2021, eager, fsdp2"):
        load_profile_file(child)
    _write(child, {"extends": "nowhere.yaml", "name": "c"})
    with pytest.raises(ProfileError, match=r"child\.yaml: field 'extends': parent profile file "
                                           r"'nowhere.yaml' not found"):
        load_profile_file(child)
    _write(child, {"extends": ["fsdp2"], "name": "c"})
    with pytest.raises(ProfileError, match=r"child\.yaml: field 'extends' must be a catalog profile "
                                           r"name or a YAML file, got \['fsdp2'\]"):
        load_profile_file(child)


def test_a_profile_that_extends_itself(tmp_path):
    me = _write(tmp_path / "me.yaml", {"extends": "me.yaml", "name": "me"})
    with pytest.raises(ProfileError, match=r"me\.yaml: field 'extends': the profile extends itself "
                                           r"\('me.yaml'\)"):
        load_profile_file(me)


def test_a_cycle_names_the_file_that_closes_it_and_the_loop(tmp_path):
    _write(tmp_path / "a.yaml", {"extends": "b.yaml", "name": "a"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml", "name": "b"})
    with pytest.raises(ProfileError, match=r"b\.yaml: field 'extends': 'a.yaml' makes a cycle "
                                           r"\(a.yaml -> b.yaml -> a.yaml\)"):
        load_profile_file(tmp_path / "a.yaml")


@pytest.mark.parametrize("child, field", [
    ({"kernal": {}}, "kernal"),
    ({"overlap": {"tp_bakward": {"value": True, "provenance": "p"}}}, "overlap.tp_bakward"),
    ({"memory": {"nccl_buffers": {"value": 1.0, "provenance": "p"}}}, "memory.nccl_buffers"),
])
def test_a_child_field_the_schema_lacks_is_named_with_the_parent(tmp_path, child, field):
    path = _write(tmp_path / "child.yaml", {"extends": "fsdp2", "name": "c", **child})
    with pytest.raises(ProfileError, match=rf"child\.yaml: field '{field}' is not a field of the "
                                           rf"profile that it extends \('fsdp2'\)"):
        load_profile_file(path)


def test_a_child_states_its_own_name(tmp_path):
    path = _write(tmp_path / "child.yaml", {"extends": "fsdp2", "description": "no name"})
    with pytest.raises(ProfileError, match=r"child\.yaml: a profile that extends 'fsdp2' states its "
                                           r"own 'name'"):
        load_profile_file(path)


def test_a_bad_parent_is_reported_against_the_parent_file(tmp_path):
    _write(tmp_path / "base.yaml", {**FSDP2, "name": "base", "pipeline": {
        **FSDP2["pipeline"], "p2p": {"value": "eventually", "provenance": "p"}}})
    path = _write(tmp_path / "child.yaml", {"extends": "base.yaml", "name": "c"})
    with pytest.raises(ProfileError, match=r"base\.yaml: field 'pipeline.p2p.value'"):
        load_profile_file(path)


# (c) the catalog's deltas

#: the fields each catalog delta states, read by hand from its YAML
CATALOG_DELTAS = {
    "deepspeed-2021": ("deepspeed", {"name", "description", "kernels.fused", "kernels.attention",
                                     "overlap.dp_param_gather", "overlap.fsdp_prefetch",
                                     "overlap.fsdp_unit", "overlap.fsdp_host_sync",
                                     "overlap.fsdp_rank_copies", "overlap.fsdp_persist_below",
                                     "fixed.loss_scale_check"}),
    "fsdp2-eager": ("fsdp2", {"name", "description", "kernels.fused", "kernels.eager",
                              "kernels.compile"}),
    "fsdp2-async-tp": ("fsdp2", {"name", "description", "overlap.tp_backward", "overlap.tp_forward"}),
    "megatron-2021-torch-ddp": ("megatron-2021", {"name", "description", "overlap.dp_grad_reduce",
                                                  "gradients.bucket_params"}),
    "nemo": ("megatron-core", {"name", "description", "gradients.main_grad",
                               "gradients.reduce_dtype", "memory.model_states", "fp8.params"}),
    "megatron-bridge": ("megatron-core", {"name", "description", "kernels.moe_probs",
                                          "gradients.main_grad", "gradients.reduce_dtype",
                                          "memory.model_states", "memory.loss_saved_bytes",
                                          "memory.loss_temp_bytes", "fp8.params"}),
}


def test_the_catalog_deltas_are_the_ones_listed():
    stated = {n: yaml.safe_load((CATALOG_DIR / f"{n}.yaml").read_text()).get("extends")
              for n in list_profiles()}
    assert {n: p for n, p in stated.items() if p is not None} == {
        n: parent for n, (parent, _) in CATALOG_DELTAS.items()}


@pytest.mark.parametrize("name", sorted(CATALOG_DELTAS))
def test_a_catalog_delta_differs_from_its_parent_exactly_in_what_it_states(name):
    parent, fields = CATALOG_DELTAS[name]
    raw = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
    assert set(_leaves({k: v for k, v in raw.items() if k != "extends"})) == fields
    assert _differing(load_profile(parent), load_profile(name)) == fields


@pytest.mark.parametrize("name", sorted(CATALOG_DELTAS))
def test_a_catalog_delta_equals_an_independent_flat_merge(name):
    """The parent's leaves updated with the child's (dotted paths, no schema walk), validated
    directly by pydantic, equal what the loader returns."""
    parent, _ = CATALOG_DELTAS[name]
    raw_parent = yaml.safe_load((CATALOG_DIR / f"{parent}.yaml").read_text())
    raw_child = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
    raw_child.pop("extends")
    flat = {**_leaves(raw_parent), **_leaves(raw_child)}
    assert ProfileSpec.model_validate(_unflatten(flat)) == load_profile(name)


# one list of names


def test_the_catalog_is_exactly_the_strategy_frameworks():
    assert set(list_profiles()) == set(FRAMEWORKS) and len(FRAMEWORKS) == len(set(FRAMEWORKS))
    check_catalog()
    for name in FRAMEWORKS:
        assert load_profile(name).name == name


def test_check_catalog_names_a_missing_or_extra_file(monkeypatch):
    monkeypatch.setattr(profiles, "FRAMEWORKS", (*FRAMEWORKS[1:], "megatron-2030"))
    with pytest.raises(ProfileError, match=r"no file for \['megatron-2030'\], files not in "
                                           r"FRAMEWORKS: \['megatron-core'\]"):
        check_catalog.__wrapped__()


def test_a_catalog_file_whose_name_is_not_its_file_name(tmp_path, monkeypatch):
    _write(tmp_path / "fsdp2.yaml", {**FSDP2, "name": "fsdp-two"})
    monkeypatch.setattr(profiles, "CATALOG_DIR", tmp_path)
    monkeypatch.setattr(profiles, "FRAMEWORKS", ("fsdp2",))
    with pytest.raises(ProfileError, match=r"fsdp2\.yaml: field 'name' is 'fsdp-two', not its file "
                                           r"name 'fsdp2'"):
        profiles._catalog.__wrapped__("fsdp2")
