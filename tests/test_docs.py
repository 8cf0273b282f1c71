"""The documentation site builds with ``mkdocs build --strict``: every page, every link between
pages and every name the API reference draws from the docstrings resolves; a broken link or a
stale name fails the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )


@pytest.mark.timeout(150)
def test_the_docs_build_strictly(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert 'id="actorsys.EvalSupervisor"' in api


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("broken", "named"),
    [("[the fleets](no-such-page.md)", "no-such-page.md"), ("::: actorsys.NoSuchName", "NoSuchName")],
)
def test_a_broken_link_or_a_stale_name_fails_the_build(
    tmp_path: Path, broken: str, named: str
) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "use.md", "a") as page:
        page.write(f"\n{broken}\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert named in done.stderr
