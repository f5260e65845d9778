"""Writes docs/results.md: one row per committed results file under benchmarks/results/, with the
script that writes it and the file's first line (what it measured, and usually the command).

    python benchmarks/results_index.py          # rewrite docs/results.md
    python benchmarks/results_index.py --check  # exit 1 when docs/results.md is out of date
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
TEXT = (".txt", ".json", ".md", ".jsonl")

HEAD = """# Measured results

Every figure in the README and in `docs/` comes from a file below (`tests/test_readme_figures.py`
checks each cited number against the files its paragraph names). Scripts under `benchmarks/`
measure side by side in one run and write `benchmarks/results/*`; rerun one to refresh its file.
This page is generated: `python benchmarks/results_index.py`.

| file | written by | first line |
|---|---|---|
"""


def _first_line(path: pathlib.Path) -> str:
    if path.suffix not in TEXT:
        return f"({path.suffix[1:]} figure)"
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip().lstrip("#").strip()
        if line and line not in ("{", "["):
            line = line.replace("|", "/").replace("`", "'")
            return line if len(line) <= 140 else line[:137] + "..."
    return "(empty)"


def _script(path: pathlib.Path) -> str:
    stem = path.name.split(".")[0]
    for name in (stem, stem.rsplit("_", 1)[0]):
        if (ROOT / "benchmarks" / f"{name}.py").exists():
            return f"`benchmarks/{name}.py`"
    return "-"


def render() -> str:
    rows = []
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        rel = path.relative_to(ROOT)
        rows.append(f"| `{rel}` | {_script(path)} | {_first_line(path)} |")
    return HEAD + "\n".join(rows) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        ok = PAGE.exists() and PAGE.read_text() == text
        print("docs/results.md is up to date" if ok else
              "docs/results.md is out of date: python benchmarks/results_index.py")
        return 0 if ok else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
