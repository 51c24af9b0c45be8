"""MkDocs hook (``hooks:`` in mkdocs.yml): the reference pages generated from the code at
build time, so that they cannot drift from it.

- ``reference/cli.md``: every command of the typer app (``meshplan.cli.app``, lazy ones
  such as ``report`` loaded), its help, usage, arguments and options grouped by the help
  panels ``--help`` shows, each option with every spelling (click's help record);
- ``reference/clusters.md``: the cluster catalog (``clusters.list_catalog``), a summary
  table and every quantity of each YAML with its provenance;
- ``reference/frameworks.md``: the framework profiles (``simulator.profiles``), likewise.

The pages are added to the build as generated files (``File.generated``, MkDocs 1.6):
nothing is written into ``docs/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any


def _cell(text: Any) -> str:
    """``text`` safe inside a Markdown table cell: pipes escaped, ``<`` as an entity (a
    ``<str>`` metavar is not an HTML tag), one line."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")


def _code(text: str) -> str:
    """``text`` as inline code inside a table cell (pipes escaped)."""
    return f"`{text}`".replace("|", "\\|")


# -- the command line ---------------------------------------------------------------------
def commands() -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(path, command, context) of every leaf command of ``meshplan.cli.app``, in the order
    ``meshplan --help`` lists them (lazy commands loaded)."""
    import typer
    from typer._click.core import Context
    from typer.core import TyperGroup

    from meshplan.cli import app

    def walk(cmd: Any, path: tuple[str, ...], parent: Any) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
        ctx = Context(cmd, info_name=path[-1] if path else "meshplan", parent=parent)
        if isinstance(cmd, TyperGroup):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                yield from walk(sub.load() if hasattr(sub, "load") else sub, (*path, name), ctx)
        else:
            yield path, cmd, ctx

    yield from walk(typer.main.get_group(app), (), None)


def _option_rows(params: list[Any], ctx: Any) -> list[str]:
    rows = ["| option | meaning |", "|---|---|"]
    for p in params:
        names, text = p.get_help_record(ctx) or ("", "")
        rows.append(f"| {_code(names)} | {_cell(text)} |")
    return rows


def command_section(path: tuple[str, ...], cmd: Any, ctx: Any) -> list[str]:
    """The Markdown of one command: heading, help, usage, arguments, option panels."""
    name = " ".join(("meshplan", *path))
    out = [f"## {name}", "", (cmd.help or "").strip(), "", "```text",
           f"{name} {' '.join(cmd.collect_usage_pieces(ctx))}", "```", ""]
    visible = [p for p in cmd.params if not getattr(p, "hidden", False)]
    args = [p for p in visible if p.param_type_name == "argument"]
    if args:
        out += ["**Arguments**", "", "| argument | meaning |", "|---|---|"]
        out += [f"| {_code(p.name.upper())} | {_cell(p.help or '')} |" for p in args]
        out.append("")
    panels: dict[str, list[Any]] = {}
    for p in visible:
        if p.param_type_name == "option":
            panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
    for panel, params in panels.items():
        out += [f"**{panel}**", "", *_option_rows(params, ctx), ""]
    return out


def cli_page() -> str:
    """``reference/cli.md``."""
    cmds = list(commands())
    out = ["# Command line", "",
           "Every command of `meshplan`, generated from the typer app at build time "
           "(`docs/gen_reference.py`); `meshplan COMMAND --help` prints the same. Options are "
           "grouped as `--help` groups them; the first spelling is the canonical one, the "
           "others are aliases (Megatron-LM's names among them).", ""]
    out += [f"- [`meshplan {' '.join(p)}`](#{_anchor('meshplan ' + ' '.join(p))})" for p, _, _ in cmds]
    out.append("")
    for path, cmd, ctx in cmds:
        out += command_section(path, cmd, ctx)
    return "\n".join(out) + "\n"


def _anchor(heading: str) -> str:
    """The id MkDocs' toc extension gives ``heading`` (lower case, spaces to dashes)."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


# -- the catalogs ---------------------------------------------------------------------------
def quantities(data: Any, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """(dotted field, value, provenance) of every ``{value, provenance}`` quantity in a
    spec's ``model_dump()``, in file order."""
    if isinstance(data, dict):
        if set(data) >= {"value", "provenance"}:
            yield prefix, data["value"], data["provenance"]
            return
        for k, v in data.items():
            yield from quantities(v, f"{prefix}.{k}" if prefix else k)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def _quantity_table(spec: Any) -> list[str]:
    rows = ["| field | value | provenance |", "|---|---|---|"]
    rows += [f"| `{f}` | {_cell(_value(v))} | {_cell(p)} |" for f, v, p in quantities(spec.model_dump())]
    return rows


def clusters_page() -> str:
    """``reference/clusters.md``."""
    from clusters import catalog_spec, list_catalog

    out = ["# Cluster catalog", "",
           "The clusters `--cluster NAME` takes, generated from `clusters/catalog/*.yaml` at "
           "build time (`docs/gen_reference.py`). Every number carries its provenance; "
           "`(approx.)` marks a default that `meshplan calibrate` replaces and `FITTED` a "
           "constant fitted on named measured runs. How to write your own: "
           "[Write a cluster YAML](../how-to/cluster-yaml.md).", "",
           "| name | device | GPUs a node | nodes (default) | peak (largest) | memory | intra-node busbw | NICs a node | collectives | description |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    specs = {n: catalog_spec(n) for n in list_catalog()}
    for name, s in specs.items():
        peak = max(s.device.peak_flops.values(), key=lambda q: q.value)  # cpu-local: fp32
        nics = s.node.nic_count.value if s.node.nic_count is not None else ""
        nic_bw = f" x {s.node.nic_bandwidth.value / 1e9:.1f} GB/s" if s.node.nic_bandwidth is not None else ""
        model = s.node.collective_model.value if s.node.collective_model is not None else "alpha-beta"
        out.append(f"| [`{name}`](#{_anchor(name)}) | {s.device.name} | {s.node.devices_per_node.value} | "
                   f"{s.cluster.num_nodes.value} | {peak.value / 1e12:.0f} TFLOP/s | "
                   f"{s.device.memory_bytes.value / 2**30:.0f} GiB | "
                   f"{s.node.intra_bandwidth.value / 1e9:.0f} GB/s | {nics}{nic_bw} | {model} | "
                   f"{_cell(s.description)} |")
    out.append("")
    for name, s in specs.items():
        out += [f"## {name}", "", _cell(s.description), "", *_quantity_table(s), ""]
    return "\n".join(out) + "\n"


def frameworks_page() -> str:
    """``reference/frameworks.md``."""
    from simulator.profiles import list_profiles, load_profile

    out = ["# Framework profiles", "",
           "How each software stack runs a step -- what fuses, what overlaps, how gradients "
           "accumulate, the optimizer's and the loss's bytes, the pipeline schedules and "
           "context-parallel exchanges it runs -- as `--framework NAME` takes it, generated "
           "from `simulator/profiles/catalog/*.yaml` at build time (`docs/gen_reference.py`; "
           "a profile that `extends:` another is shown resolved). The same plan costs "
           "differently under each; every report names its profile.", "",
           "| name | schedules | cp exchanges | model states | description |", "|---|---|---|---|---|"]
    profiles = {n: load_profile(n) for n in list_profiles()}
    for name, p in profiles.items():
        d = p.model_dump()
        sched = _value(d["pipeline"]["schedules"]["value"]) if d["pipeline"].get("schedules") else "all"
        cp = d["kernels"].get("cp_comms") or {}
        states = d["memory"]["model_states"]["value"] if d["memory"].get("model_states") else ""
        out.append(f"| [`{name}`](#{_anchor(name)}) | {_cell(sched)} | {_cell(_value(cp.get('value', '')))} | "
                   f"{_cell(states)} | {_cell(p.description)} |")
    out.append("")
    for name, p in profiles.items():
        out += [f"## {name}", "", _cell(p.description), "", *_quantity_table(p), ""]
    return "\n".join(out) + "\n"


PAGES = {"reference/cli.md": cli_page, "reference/clusters.md": clusters_page,
         "reference/frameworks.md": frameworks_page}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages to the build."""
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files
