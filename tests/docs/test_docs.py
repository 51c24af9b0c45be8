"""The documentation site (issue 40): ``mkdocs build --strict`` passes (no broken link or
anchor, every page in the nav, every docstring readable), the strictness really refuses a
broken link and an orphan page, and every command block of the docs runs.

The blocks of a page run in order in one scratch folder (a tutorial's later commands use
what its earlier ones wrote): ```bash blocks line by line with the README runner of
``tests/docs/test_readme_commands.py`` (the same here-documents, illustrative lines, CI caps
on trials and steps, shared calibration), ```python blocks with ``exec``. A page whose
blocks take long is marked slow (:data:`SLOW`). Nothing may be written into the
repository: the runner works in ``tmp_path`` and the test checks the repository's top
level after each page."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.test_readme_commands import _fast, _lines, _run_block, _shared_calibration

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
mkdocs = pytest.importorskip("mkdocs", reason="the docs extra (make test installs it)")

#: pages whose blocks take more than a few seconds (local torch.distributed runs, a
#: calibration, searches, the time-to-train Monte Carlo): still run by make test
SLOW = {"tutorials/tour.md", "tutorials/check-locally.md", "tutorials/search-many-machines.md", "how-to/compare-plans.md",
        "how-to/cluster-yaml.md", "explanation/search.md", "reference/models.md", "time_to_train.md"}


def _env() -> dict[str, str]:
    return {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, env=_env(), timeout=600)


def test_the_site_builds_strict(tmp_path):
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the generated reference pages are there, with every command of the app
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for cmd in ("meshplan-cost", "meshplan-tune", "meshplan-clusters-show", "meshplan-report"):
        assert f'id="{cmd}"' in cli
    assert "--tensor-model-parallel-size" in cli
    clusters = (tmp_path / "site" / "reference" / "clusters" / "index.html").read_text()
    assert 'id="dgx-h100"' in clusters and "provenance" in clusters
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="meshplan.engine.Engine"' in api and "mfu_causal" in api
    assert not any(p.name == "gen_reference.py" for p in (tmp_path / "site").rglob("*"))


def test_strict_refuses_a_broken_link_and_a_page_outside_the_nav(tmp_path):
    """The validation settings of mkdocs.yml, on a two-page site: a link to a missing page,
    a missing anchor and a page left out of the nav each fail the build."""
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](gone.md) and [no anchor](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    cfg = {"site_name": "t", "strict": ours["strict"], "validation": ours["validation"],
           "nav": ["index.md", "other.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "gone.md" in proc.stderr and "nowhere" in proc.stderr and "orphan.md" in proc.stderr


def _pages() -> list[str]:
    """Every Markdown page of docs/ with a ```bash or ```python block."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                  if re.search(r"```(bash|python)\n", p.read_text()))


def _blocks(page: str) -> list[tuple[str, str]]:
    return re.findall(r"```(bash|python)\n(.*?)```", (DOCS / page).read_text(), re.S)


PAGES = _pages()


def test_every_guide_has_commands_that_run():
    assert {"tutorials/plan-70b.md", "tutorials/check-locally.md", "tutorials/search-many-machines.md",
            "how-to/cluster-yaml.md", "how-to/import-configs.md", "how-to/perfetto.md",
            "how-to/optuna-dashboard.md"} <= set(PAGES)


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p
                                  for p in PAGES])
def test_docs_page_commands_run(page, tmp_path, monkeypatch, capsys, request):
    before = sorted(os.listdir(ROOT))
    calibrated = None
    for kind, body in _blocks(page):
        if kind == "bash" and any(_shared_calibration(_fast(shlex.split(ln))[1:])
                                  for ln in _lines(body) if ln.startswith("meshplan calibrate")):
            calibrated = request.getfixturevalue("quick_calibration")[0]
    ran = 0
    for kind, body in _blocks(page):
        if kind == "bash":
            ran += len(_run_block(body, tmp_path, monkeypatch, capsys, calibrated))
        else:
            monkeypatch.chdir(tmp_path)
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(body, f"docs/{page}", "exec"), {})
            ran += 1
    assert ran, f"docs/{page}: no block ran"
    assert sorted(os.listdir(ROOT)) == before, f"docs/{page} wrote into the repository"


# -- the README's links into the site -------------------------------------------------------

def _slug(title: str) -> str:
    """A heading's anchor as the toc extension makes it (lower case, punctuation dropped,
    spaces as hyphens)."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title.strip().lower()))


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def _generated() -> set[str]:
    """The pages docs/gen_reference.py writes at build time (docs/reference/cli.md, ...)."""
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    return set(gen_reference.PAGES)


def test_readme_links_reach_pages_of_the_site():
    """Every relative link of README.md names a file that exists (a page of docs/ that the
    nav lists, or one generated at build time) and, with ``#anchor``, a heading of it; the
    README is short (issue 40: at most 250 lines) and links every page of the nav."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(), )["nav"]

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for x in node for p in pages(x)]
        return [p for v in node.values() for p in pages(v)]

    in_nav, generated = set(pages(nav)), _generated()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) >= 20
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        assert path.startswith("docs/"), f"README link outside the docs: {link}"
        rel = path[len("docs/"):]
        if rel.endswith("/") or rel == "":
            rel += "index.md"
        assert rel in in_nav, f"README links {link}, a page not in mkdocs.yml's nav"
        if rel in generated:
            continue
        assert (DOCS / rel).is_file(), f"README links {link}: no such page"
        if anchor:
            assert anchor in _anchors(DOCS / rel), f"README links {link}: no such heading"
    linked = {ln.partition("#")[0][len("docs/"):] for ln in links if ln.startswith("docs/")}
    assert in_nav - linked - {"index.md"} == set(), f"nav pages the README does not link: {in_nav - linked}"


def test_the_link_check_catches_a_broken_anchor():
    assert "set-up" in _anchors(DOCS / "index.md")
    assert "no-such-heading" not in _anchors(DOCS / "index.md")



def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header row starts ``header``."""
    rows = []
    for ln in text[text.index(header):].splitlines()[2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows


def test_readme_headline_figures_are_the_pages_figures():
    """The README's two headline tables repeat the fidelity and search pages' figures (the
    pages are where `meshplan report` results are recorded): a figure changed on a page
    and not in the README, or the other way, fails here."""
    readme = (ROOT / "README.md").read_text()
    fid = {r[0].split(" (")[0]: r for r in _table((DOCS / "explanation" / "fidelity.md").read_text(),
                                                   "| source | rows | MAPE |")}
    ours = _table(readme, "| rows | count | MAPE |")
    assert len(ours) == 2
    for row, src in zip(ours, ("all dense", "mbridge_perf_moe"), strict=True):
        page = fid[src]
        assert (row[1], row[2], row[3]) == (page[1], page[2], page[6]), (row, page)
        assert row[4] == re.search(r"\(([-+0-9.]+%)\)", page[4]).group(1)
    search = (DOCS / "explanation" / "search.md").read_text()
    table = _table(search, "| case | candidates | default_ms |")
    for row, page in zip(_table(readme, "| case | default answer |"), table, strict=True):
        assert row[0] == page[0], (row, page)
        assert row[1].split(" ms")[0].replace(",", "") == page[2], (row, page)
        assert f"proven in {page[5]} s" in row[1] and page[4] == "yes", (row, page)
        assert row[2] == f"+{page[9]}%", (row, page)
