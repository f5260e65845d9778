"""The README and the docs/ pages stand alone and their figures have sources.

Every check below runs over README.md and each docs/*.md page; the README is a guide of at most
300 lines, and docs/results.md (the index of benchmarks/results/) is the generator's output.

- Every repository path it names in backticks (composer_jax/..., benchmarks/..., docs/..., ...)
  exists in the repository, and it names nothing outside it (no `shared/`, no DESIGN.md but the
  repository's own docs/design.md).
- Every paragraph (or table row) that cites a committed results file (`benchmarks/results/X`, a
  bare results file name, or the benchmark script `benchmarks/X.py` that writes
  `benchmarks/results/X.*`) quotes only figures found in those files: each decimal number in the
  paragraph must equal a number of the files at the paragraph's precision (or as a percentage).
  Versions (Python 3.11, ==0.12) and stated targets ("target 0.4") are not figures.
- The main command's results file says which command wrote it, and the README names that command
  beside the figures.
"""
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
TEXT_SUFFIXES = (".txt", ".json", ".md", ".jsonl")
REPO_DIRS = ("composer_jax/", "benchmarks/", "docs/", "tests/", "notebooks/", "experiments/",
             "pallas_kernels/", "requirements/", ".ci/")


def _expand(name: str) -> list[str]:
    """a.{txt,png} -> [a.txt, a.png] (one brace group)."""
    m = re.match(r"(.*)\{([^}]*)\}(.*)", name)
    if not m:
        return [name]
    return [m.group(1) + part.strip() + m.group(3) for part in m.group(2).split(",")]


def _blocks(page: str = README) -> list[tuple[str, str]]:
    """(text, where its sources are named): paragraphs, and every table row on its own; a row's
    sources are the files it names and those of the paragraph just above the table (its caption)."""
    out, caption = [], ""
    for block in re.split(r"\n\s*\n", page):
        lines = block.splitlines()
        if lines and all(line.startswith("|") for line in lines):
            out += [(line, line + "\n" + caption) for line in lines]
        else:
            out.append((block, block))
            caption = block
    return out


def _sources(block: str) -> list[pathlib.Path]:
    names = []
    for m in re.finditer(r"benchmarks/results/([\w.\-]+(?:\{[^}]*\})?[\w.\-]*)", block):
        names += _expand(m.group(1).rstrip("."))
    for m in re.finditer(r"`([\w\-]+\.(?:txt|json|md|jsonl))`", block):
        names.append(m.group(1))
    for m in re.finditer(r"(?<![\w/])(?:benchmarks/)?(\w+)\.py\b", block):
        names += [p.name for p in RESULTS.glob(m.group(1) + ".*")]
    return sorted({RESULTS / n for n in names
                   if (RESULTS / n).is_file() and (RESULTS / n).suffix in TEXT_SUFFIXES})


def _numbers(text: str) -> list[float]:
    """Every number of a results file, also as GiB and GB when it could be a byte count."""
    xs = [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]
    return xs + [x / 2**30 for x in xs if x >= 2**20] + [x / 1e9 for x in xs if x >= 1e6]


_FIGURE = re.compile(r"(?<![\w.\-/`=])(?<!Python )(?<!target )(\d+\.\d+)(?![\w.])")


def _sourced(fig: str, have: list[float]) -> bool:
    tol = 0.5 * 10 ** -len(fig.split(".")[1]) + 1e-9
    v = float(fig)
    return any(abs(h - v) <= tol or abs(h * 100 - v) <= tol for h in have)


# Pages other issues own whose figures are being re-sourced there; strict: a fixed page fails here
# until its entry is removed.
OWNED_ELSEWHERE: dict[str, str] = {}


def _pages():
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=OWNED_ELSEWHERE[n]))
            if n in OWNED_ELSEWHERE else n for n in sorted(PAGES)]


@pytest.mark.parametrize("name", _pages())
def test_pages_name_nothing_outside_the_repository(name):
    text = PAGES[name]
    assert not re.search(r"(?<![\w/])shared/|/work/", text), "names a path outside the repository"
    assert not re.search(r"(?<!docs/design\.md)(?<!docs/)DESIGN\.md", text)
    missing = []
    for m in re.finditer(r"`([^`\s]+)`", text):
        token = m.group(1).rstrip(".,:")
        if not token.startswith(REPO_DIRS) or any(c in token for c in "*<>$"):
            continue
        for part in _expand(token.split(":")[0]):
            if not (ROOT / part).exists():
                missing.append(part)
    assert not missing, f"{name} names paths the repository does not have: {missing}"


@pytest.mark.parametrize("name", _pages())
def test_every_figure_is_in_the_results_file_it_cites(name):
    problems = []
    for block, named in _blocks(PAGES[name]):
        sources = _sources(named)
        if not sources:
            continue
        have = [x for p in sources for x in _numbers(p.read_text())]
        unsourced = [f for f in _FIGURE.findall(block) if not _sourced(f, have)]
        if unsourced:
            problems.append(f"{[p.name for p in sources]}: {unsourced} in {block[:120]!r}")
    assert not problems, f"{name}: figures without a source:\n" + "\n".join(problems)


def test_the_readme_is_a_short_guide_whose_links_resolve():
    assert len(README.splitlines()) <= 300
    for name in ("docs/config.md", "docs/sweeps.md", "docs/results.md", "docs/design.md"):
        assert f"`{name}`" in README
    assert "load average" not in README.lower()


def test_the_results_index_is_current():
    spec = importlib.util.spec_from_file_location("results_index",
                                                  ROOT / "benchmarks" / "results_index.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "results.md").read_text() == mod.render(), \
        "docs/results.md is stale: python benchmarks/results_index.py"


def test_the_main_command_figures_name_the_command_that_wrote_them():
    text = (RESULTS / "rl_heldout.txt").read_text()
    assert "python launch.py --experiment=rl_async" in text.split("\n\n")[0]
    cites = [b for b, _ in _blocks() if "rl_heldout.txt" in b]
    assert cites and all("benchmarks/rl_heldout.py" in b for b in cites)
    assert "launch.py --experiment=rl_async --workdir=runs/rl_async" in README


def test_the_viz_extra_the_readme_promises_exists():
    assert "pip install -e '.[viz]'" in README
    assert re.search(r"^tensorboard==", (ROOT / "requirements" / "viz.txt").read_text(), re.M)
    assert 'viz = { file = ["requirements/viz.txt"] }' in (ROOT / "pyproject.toml").read_text()
