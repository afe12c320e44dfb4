"""The code's citations of the design resolve: every ``design.md §N`` names a section of docs/design.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_design_citation_names_a_section():
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "design.md").read_text(), re.M))
    cited = {}
    for folder in ("src", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for n in re.findall(r"design\.md §(\d+)", path.read_text()):
                cited.setdefault(n, []).append(str(path.relative_to(ROOT)))
    assert cited, "the code cites the design somewhere"
    missing = {n: files for n, files in cited.items() if n not in sections}
    assert not missing, f"citations of sections docs/design.md does not have: {missing}"
    stale = [str(p.relative_to(ROOT)) for folder in ("src", "tests", "benchmarks")
             for p in (ROOT / folder).rglob("*.py") if re.search(r"(?<![/\w])DESIGN\.md", p.read_text())]
    assert not stale, f"cite docs/design.md, not the brief outside the repository: {stale}"
