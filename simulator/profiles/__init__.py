"""Framework profiles: how a software stack runs a step (``spec``), the built-in catalog
(``catalog/*.yaml``: megatron-core, megatron-2021, fsdp2, llm-foundry, deepspeed, eager and
their variants, some stated as ``extends:`` deltas; ``loader``) and :func:`load_profile`.

The catalog's names are ``completion.strategy.FRAMEWORKS`` (the one list the Strategy
validates against): :func:`check_catalog` checks that the files are exactly those names and
that each file's ``name:`` is its file name."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from completion.choices import FRAMEWORKS
from simulator.profiles.loader import CATALOG_DIR, load_profile_file, parse_profile
from simulator.profiles.spec import FUSION_GROUPS, STATE_MODELS, ProfileError, ProfileSpec


def list_profiles() -> list[str]:
    """Names of the built-in framework profiles (the catalog's file names), sorted."""
    return list(_catalog_names())


@lru_cache(maxsize=1)
def _catalog_names() -> tuple[str, ...]:
    """The catalog's file names, read once (the package's own files: fixed while it runs)."""
    return tuple(sorted(p.stem for p in CATALOG_DIR.glob("*.yaml")))


@lru_cache(maxsize=1)
def check_catalog() -> None:
    """Raise ProfileError unless the catalog's files are exactly
    ``completion.strategy.FRAMEWORKS`` (one ``<name>.yaml`` each), naming the missing and
    the extra names."""
    files = set(list_profiles())
    missing, extra = sorted(set(FRAMEWORKS) - files), sorted(files - set(FRAMEWORKS))
    if missing or extra:
        raise ProfileError(f"framework profile catalog {CATALOG_DIR} does not match "
                           f"completion.strategy.FRAMEWORKS: no file for {missing}, files not "
                           f"in FRAMEWORKS: {extra}")


@lru_cache(maxsize=64)
def _catalog(name: str) -> ProfileSpec:
    check_catalog()
    path = CATALOG_DIR / f"{name}.yaml"
    spec = load_profile_file(path)
    if spec.name != name:
        raise ProfileError(f"{path}: field 'name' is {spec.name!r}, not its file name {name!r}")
    return spec


def load_profile(name_or_path: str | Path) -> ProfileSpec:
    """A profile from a catalog name (``megatron-core``) or a YAML file path. Raises
    ProfileError for an unknown name (listing the catalog) or a bad file."""
    text = str(name_or_path)
    if text in _catalog_names():
        return _catalog(text)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_profile_file(path)
    raise ProfileError(f"unknown framework profile {text!r}: not a file and not in the catalog "
                       f"({', '.join(list_profiles())})")


__all__ = ["CATALOG_DIR", "FUSION_GROUPS", "STATE_MODELS", "ProfileError", "ProfileSpec",
           "check_catalog", "list_profiles", "load_profile", "load_profile_file", "parse_profile"]
