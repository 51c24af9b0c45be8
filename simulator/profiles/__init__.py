"""Framework profiles: how a software stack runs a step (``spec``), the built-in catalog
(``catalog/*.yaml``: megatron-core, megatron-2021, fsdp2, llm-foundry, deepspeed, eager)
and :func:`load_profile`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from simulator.profiles.spec import (
    FUSION_GROUPS,
    STATE_MODELS,
    ProfileError,
    ProfileSpec,
    load_profile_file,
    parse_profile,
)

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


def list_profiles() -> list[str]:
    """Names of the built-in framework profiles, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


@lru_cache(maxsize=64)
def _catalog(name: str) -> ProfileSpec:
    return load_profile_file(CATALOG_DIR / f"{name}.yaml")


def load_profile(name_or_path: str | Path) -> ProfileSpec:
    """A profile from a catalog name (``megatron-core``) or a YAML file path. Raises
    ProfileError for an unknown name (listing the catalog) or a bad file."""
    text = str(name_or_path)
    if text in list_profiles():
        return _catalog(text)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_profile_file(path)
    raise ProfileError(f"unknown framework profile {text!r}: not a file and not in the catalog "
                       f"({', '.join(list_profiles())})")


__all__ = ["CATALOG_DIR", "FUSION_GROUPS", "STATE_MODELS", "ProfileError", "ProfileSpec",
           "list_profiles", "load_profile", "load_profile_file", "parse_profile"]
