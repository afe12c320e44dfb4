"""The project's metadata (issue 20 items 9 and 11): license, authors, URLs, py.typed, the
changelog, and extras that hold what the code imports."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_authors_urls_and_typing_marker():
    meta = PROJECT["project"]
    assert meta["license"] == "Apache-2.0" and "Apache License" in (ROOT / "LICENSE").read_text()
    assert all((ROOT / f).is_file() for f in meta["license-files"])
    assert meta["authors"] and all(a.get("name") for a in meta["authors"])
    urls = meta["urls"]
    assert {"Homepage", "Repository", "Issues", "Changelog"} <= set(urls)
    assert all(re.fullmatch(r"https://\S+", u) for u in urls.values())
    assert (ROOT / "src" / "einsummable" / "py.typed").is_file()
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["einsummable"]
    assert "Typing :: Typed" in meta["classifiers"]


def test_changelog_lists_the_released_version_and_what_is_unreleased():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## Unreleased" in text and f"## {PROJECT['project']['version']}" in text


def test_the_demo_extra_holds_matplotlib_and_the_base_install_no_heavy_package():
    meta = PROJECT["project"]
    base = " ".join(meta["dependencies"])
    assert not re.search(r"\b(torch|matplotlib|ray|transformers)\b", base)
    extras = meta["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["demo"])
    assert any(d.startswith("sentencepiece") for d in extras["llama"])
    assert not any(d.startswith("safetensors") for d in extras["llama"])  # weights load through our reader
