"""Evaluation reports: eval.json (stable keys), a Markdown table, plots, and side-by-side comparison.

eval.json (format 1):
  format, suite_id, suite {num_tasks, median_lines_changed, categories, lines_changed},
  policy {name, kind, ...}, settings {samples, styles, prices, ...}, created, wall_s,
  summary   {"all" | STYLE: {resolved, partial, pass@1, pass@K, regressions, new_pyflakes_warnings,
             diff_lines, diff_ratio, out_of_scope_files, test_edits, generated_tokens, prompt_tokens,
             cached_prompt_tokens, tool_calls, turns, wall_s, price, invalid_calls,
             tests_run_before_finish, claims_success, false_claim, final_message_chars, crashed
             (episodes that raised: scored unresolved), ...,
             num_tasks, resolved_stderr}}
  by_category {"all" | STYLE: {CATEGORY: {same keys}}}
  tasks     [{task_id, category, style, samples, num_resolved, pass@k..., means of the episode
             fields}]   (one row per task and style)
  episodes  [the flat episode records of `composer_jax.eval.runner.episode_record`]
Every rate is a mean over tasks of the per-task mean over samples; "all" pools both styles (each
task counts once per style).
"""
from __future__ import annotations

import collections
import datetime
import json
import pathlib

from composer_jax.env.tasks.pool import atomic_write_text
from composer_jax.eval.metrics import aggregate, binomial_stderr, task_summary

FORMAT = 1
TABLE_COLUMNS = [("resolved", "resolved", "{:.3f}"), ("partial", "partial", "{:.3f}"),
                 ("pass@1", "pass@1", "{:.3f}"), ("pass@k", "pass@k", "{:.3f}"),
                 ("regressions", "regr.", "{:.2f}"), ("new_pyflakes_warnings", "new warn.", "{:.2f}"),
                 ("diff_ratio", "diff/ref", "{:.2f}"), ("out_of_scope_files", "out-of-scope", "{:.2f}"),
                 ("test_edits", "test edits", "{:.2f}"), ("generated_tokens", "gen tok", "{:.0f}"),
                 ("prompt_tokens", "prompt tok", "{:.0f}"),
                 ("cached_prompt_tokens", "cached tok", "{:.0f}"), ("tool_calls", "calls", "{:.1f}"),
                 ("turns", "turns", "{:.1f}"), ("wall_s", "wall s", "{:.1f}"),
                 ("price", "price $", "{:.4f}"), ("invalid_calls", "invalid", "{:.2f}"),
                 ("tests_run_before_finish", "tested", "{:.2f}"), ("false_claim", "false claim", "{:.2f}"),
                 ("final_message_chars", "final chars", "{:.0f}"), ("crashed", "crashed", "{:.2f}")]


def summarize(records: list[dict], samples: int) -> dict:
    """{"summary", "by_category", "tasks"} from episode records (see the module docstring)."""
    ks = sorted({1, samples})
    groups = collections.defaultdict(list)
    for r in records:
        groups[(r["task_id"], r["style"])].append(r)
    tasks = []
    for (tid, style), rs in sorted(groups.items()):
        row = {"task_id": tid, "category": rs[0]["category"], "kind": rs[0]["kind"], "style": style,
               **task_summary(rs, ks)}
        row["pass@k"] = row.get(f"pass@{samples}", row["pass@1"])
        tasks.append(row)

    def agg(rows):
        a = aggregate(rows, ks)
        a["num_rows"] = a["num_tasks"]                       # task x prompt-style rows
        a["num_tasks"] = len({r["task_id"] for r in rows})   # distinct tasks
        a["resolved_stderr"] = binomial_stderr(a.get("resolved", 0.0), a["num_rows"])
        return a

    styles = sorted({r["style"] for r in tasks})
    summary = {"all": agg(tasks), **{s: agg([r for r in tasks if r["style"] == s]) for s in styles}}
    by_cat = {}
    for s in ["all", *styles]:
        rows = tasks if s == "all" else [r for r in tasks if r["style"] == s]
        cats = sorted({r["category"] for r in rows})
        by_cat[s] = {c: agg([r for r in rows if r["category"] == c]) for c in cats}
    return {"summary": summary, "by_category": by_cat, "tasks": tasks}


def build_result(records, *, suite, policy: dict, settings: dict, wall_s: float) -> dict:
    m = suite.manifest
    return {"format": FORMAT, "suite_id": suite.suite_id,
            "suite": {k: m[k] for k in ("num_tasks", "median_lines_changed", "categories",
                                        "lines_changed")},
            "policy": policy, "settings": settings,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": wall_s, **summarize(records, settings["samples"]), "episodes": records}


def _row(name: str, d: dict) -> str:
    cells = [fmt.format(d.get(k, float("nan"))) for k, _, fmt in TABLE_COLUMNS]
    return f"| {name} | " + " | ".join(cells) + " |"


def _header(first: str) -> list[str]:
    return ["| " + first + " | " + " | ".join(h for _, h, _ in TABLE_COLUMNS) + " |",
            "|" + "---|" * (len(TABLE_COLUMNS) + 1)]


def markdown(result: dict) -> str:
    """The Markdown report of one result: overall and per-style rows, then per category."""
    s = result["suite"]
    lines = [f"# Evaluation: {result['policy']['name']} on {result['suite_id']}", "",
             f"{s['num_tasks']} tasks ({', '.join(f'{c} {n}' for c, n in s['categories'].items() if n)}), "
             f"median changed lines {s['median_lines_changed']:g}; "
             f"{result['settings']['samples']} sample(s) per task and prompt style; "
             f"wall {result['wall_s']:.0f} s.", ""]
    lines += _header("prompt style")
    for style, d in result["summary"].items():
        lines.append(_row(style, d))
    lines += ["", "## By category (both prompt styles)", ""]
    lines += _header("category")
    for cat, d in result["by_category"]["all"].items():
        lines.append(_row(f"{cat} ({int(d['num_tasks'])})", d))
    lines += ["", "## Changed lines of the reference fixes", "",
              "| category | n | min | median | max |", "|---|---|---|---|---|"]
    for cat, st in s["lines_changed"].items():
        if st.get("n"):
            lines.append(f"| {cat} | {st['n']} | {st['min']} | {st['median']:g} | {st['max']} |")
    return "\n".join(lines) + "\n"


def compare_markdown(results: list[dict], names: list[str]) -> str:
    """Several results side by side: one row per result and style, then resolved per category."""
    ids = sorted({r["suite_id"] for r in results})
    lines = ["# Evaluation comparison", "",
             "Suite: " + ", ".join(ids) + ("" if len(ids) == 1 else
                                           "  **(different suites: numbers are not comparable)**"),
             ""]
    lines += _header("policy / prompt style")
    for name, r in zip(names, results):
        for style, d in r["summary"].items():
            lines.append(_row(f"{name} / {style}", d))
    cats = sorted({c for r in results for c in r["by_category"]["all"]})
    lines += ["", "## Resolved rate by category (both prompt styles)", "",
              "| policy | " + " | ".join(cats) + " |", "|" + "---|" * (len(cats) + 1)]
    for name, r in zip(names, results):
        cells = [f"{r['by_category']['all'][c]['resolved']:.3f}" if c in r["by_category"]["all"]
                 else "-" for c in cats]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], names: list[str], path: pathlib.Path) -> None:
    """Two panels: resolved rate vs mean price per episode (one point per policy and prompt
    style), and resolved rate per category (bars per policy)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    markers = {"terse": "o", "detailed": "s"}
    for i, (name, r) in enumerate(zip(names, results)):
        color = f"C{i}"
        for style, d in r["summary"].items():
            if style == "all":
                continue
            ax1.scatter(d["price"], d["resolved"], color=color, marker=markers.get(style, "^"),
                        s=60, label=f"{name} ({style})")
    prices = [d["price"] for r in results for k, d in r["summary"].items() if k != "all" and d["price"] > 0]
    if prices and max(prices) / min(prices) > 20:
        ax1.set_xscale("log")
    ax1.set_xlabel("mean price per episode ($, config prices)")
    ax1.set_ylabel("resolved rate")
    ax1.set_ylim(-0.05, 1.05)
    ax1.set_title("resolved vs cost")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    cats = sorted({c for r in results for c in r["by_category"]["all"]})
    width = 0.8 / max(1, len(results))
    for i, (name, r) in enumerate(zip(names, results)):
        vals = [r["by_category"]["all"].get(c, {}).get("resolved", 0.0) for c in cats]
        ax2.bar([j + i * width for j in range(len(cats))], vals, width, label=name, color=f"C{i}")
    ax2.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(cats))])
    ax2.set_xticklabels(cats)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("resolved rate (both prompt styles)")
    ax2.set_title("by category")
    ax2.legend(fontsize=7)
    fig.suptitle(", ".join(sorted({r["suite_id"] for r in results})), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(result: dict, out_dir: pathlib.Path, stem: str = "eval") -> dict:
    """Writes STEM.json, STEM.md and STEM.png into `out_dir`; returns their paths."""
    out_dir = pathlib.Path(out_dir)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md",
             "png": out_dir / f"{stem}.png"}
    atomic_write_text(paths["json"], json.dumps(result, indent=1))
    atomic_write_text(paths["md"], markdown(result))
    plot([result], [result["policy"]["name"]], paths["png"])
    return paths


def write_comparison(results: list[dict], names: list[str], out_dir: pathlib.Path,
                     stem: str = "eval_compare") -> dict:
    """Writes STEM.md, STEM.json (the summaries side by side) and STEM.png."""
    out_dir = pathlib.Path(out_dir)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md",
             "png": out_dir / f"{stem}.png"}
    slim = [{k: r[k] for k in ("suite_id", "policy", "settings", "summary", "by_category", "created")}
            for r in results]
    atomic_write_text(paths["json"], json.dumps({"format": FORMAT, "names": names, "results": slim},
                                                indent=1))
    atomic_write_text(paths["md"], compare_markdown(results, names))
    plot(results, names, paths["png"])
    return paths
