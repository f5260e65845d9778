"""Per-buffer memory report of a compiled step: its largest temporaries, what made them, when.

Reads three of XLA's text dumps (`--xla_dump_to=DIR --xla_dump_hlo_as_text`; XLA:CPU and libtpu's
XLA:TPU both write them): the buffer assignment (`*-buffer-assignment.txt`: every allocation, its
size and the HLO values that share it), the optimized module (`compiled.as_text()`: each
instruction's opcode, shape with layout, op_name = the jax name stack, and stack frame = the
Python source line) and the live ranges (`*-live-range.txt`: each top-level value's first and
last position in the schedule, and the schedule's peak). Temporaries are the allocations that
are neither parameters (arguments), constants nor thread-local; each is reported with its
largest value. Sizes are the allocation's bytes on the device (TPU tiled layouts pad a minor
dim to 128 lanes, so an f32[V,64] buffer laid out {1,0} takes twice its logical bytes).

Shape glossary: none (text in, dicts out).
"""
from __future__ import annotations

import glob
import os
import re

from composer_jax.parallel.hlo_stats import short_op_name

_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):$")
_VALUE = re.compile(r"^ value: <\d+ ([\w.\-]+)(\{[\d,]*\})? @\d+> \(size=(\d+),offset=\d+\): (.*)$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z\-]*)\(")


def _frames(hlo: str) -> dict[int, str]:
    """stack_frame_id -> 'file:line (function)' of the innermost frame in the project's code
    (the frame chain walked from the op's own frame outwards; else the innermost frame)."""
    def table(name):
        m = re.search(rf"^{name}\n(.*?)(?:\n\n|\n(?=[A-Z]))", hlo, re.M | re.S)
        return m.group(1).splitlines() if m else []

    files = {int(i): f.strip('"') for i, f in (ln.split(" ", 1) for ln in table("FileNames"))}
    funcs = {int(i): f.strip('"') for i, f in (ln.split(" ", 1) for ln in table("FunctionNames"))}
    locs, frames = {}, {}
    for ln in table("FileLocations"):
        m = re.match(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", ln)
        if m:
            locs[int(m.group(1))] = (files.get(int(m.group(2)), "?"),
                                     funcs.get(int(m.group(3)), "?"), int(m.group(4)))
    for ln in table("StackFrames"):
        m = re.match(r"(\d+) \{file_location_id=(\d+)(?: parent_frame_id=(\d+))?", ln)
        if m:
            frames[int(m.group(1))] = (int(m.group(2)), int(m.group(3) or 0))

    def describe(fid):
        chain, seen = [], set()
        while fid in frames and fid not in seen:
            seen.add(fid)
            loc, parent = frames[fid]
            if loc in locs:
                chain.append(locs[loc])
            fid = parent
        mine = [c for c in chain if "/composer_jax/" in c[0]
                and not c[0].endswith(("/parallel/sharding.py", "/parallel/api.py"))]
        f, fn, line = (mine or chain or [("?", "?", 0)])[0]
        short = f.split("/composer_jax/", 1)[-1] if "/composer_jax/" in f else f.rsplit("/", 1)[-1]
        return f"{short}:{line} ({fn})"

    return {fid: describe(fid) for fid in frames}


def instructions(hlo: str) -> dict[str, dict]:
    """Instruction name -> {op, shape, op_name, source} from the optimized module's text."""
    frames = _frames(hlo)
    out = {}
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        op_name = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        kind = re.search(r"\bkind=(k\w+)", line)
        calls = re.search(r"calls=%?([\w.\-]+)", line)
        op = m.group(3)
        if op == "fusion":
            op = f"fusion:{kind.group(1) if kind else '?'}"
        out[m.group(1)] = {"op": op, "shape": m.group(2), "calls": calls and calls.group(1),
                           "op_name": op_name.group(1) if op_name else "",
                           "source": frames.get(int(frame.group(1)), "") if frame else ""}
    return out


def live_ranges(text: str) -> tuple[dict[str, tuple[int, int]], int | None, int | None]:
    """({value name with index: (start, end)}, schedule length, peak position) of XLA's
    live-range dump (top-level schedule positions; values inside loops are not listed)."""
    ranges = {k: (int(a), int(b)) for k, a, b in
              re.findall(r"^\s+([\w.\-]+\{[\d,]*\}):(\d+)-(\d+)\s*$", text, re.M)}
    n = re.search(r"HloLiveRange \(max (\d+)\)", text)
    peak = re.search(r"Live ranges at (\d+) \(peak\)", text)
    return ranges, n and int(n.group(1)), peak and int(peak.group(1))


def temporaries(buffer_assignment: str, hlo: str, live_range: str = "",
                top: int = 20) -> list[dict]:
    """The `top` largest temporary buffers, largest first, buffers of one source and shape
    grouped: [{bytes (one buffer), count, op (HLO opcode; fusion:kind), instruction (the first),
    shape, layout, op_name (the jax name stack, shortened), source (file:line of the project's
    code that made it), live (start, end) in the top-level schedule or None (inside a loop
    body), live_of (schedule length), offset (in its allocation)}].

    XLA:TPU packs most temporaries into one preallocated block at fixed offsets, so buffers are
    read per HLO value (with its own size and offset), not per allocation."""
    info = instructions(hlo)
    ranges, length, _ = live_ranges(live_range) if live_range else ({}, None, None)
    vals, temp = [], False
    for line in buffer_assignment.splitlines():
        m = _ALLOC.match(line)
        if m:
            temp = not any(t in m.group(3) for t in ("parameter", "constant", "thread-local"))
            continue
        if line.startswith("allocation"):
            temp = False
            continue
        v = _VALUE.match(line)
        if temp and v and not v.group(4).startswith("("):
            off = re.search(r"offset=(\d+)", line)
            vals.append((int(v.group(3)), v.group(1), v.group(2) or "{}", v.group(4),
                         int(off.group(1)) if off else 0))
    groups: dict[tuple, dict] = {}
    for size, name, index, shape, off in sorted(vals, key=lambda t: -t[0]):
        ins = info.get(name, {})
        op, op_name, source = ins.get("op", "?"), ins.get("op_name", ""), ins.get("source", "")
        if not op_name and op.startswith(("copy", "bitcast", "get-tuple", "transpose")):
            op_name = "(layout change / copy, no jax op)"
        shape = shape.strip()
        bare = re.sub(r"\{[^{}]*\}$", "", shape)
        key = (size, bare, op, source, short_op_name(op_name, keep=6))
        if key in groups:
            groups[key]["count"] += 1
            continue
        if len(groups) >= top:
            continue
        groups[key] = {"bytes": size, "count": 1, "instruction": name + index, "op": op,
                       "shape": bare, "layout": shape[len(bare):],
                       "op_name": short_op_name(op_name, keep=6), "source": source,
                       "live": ranges.get(name + index), "live_of": length, "offset": off}
    return list(groups.values())


def format_rows(rows: list[dict], n: int = 12) -> list[str]:
    """Printable lines of `temporaries`' rows."""
    lines = []
    for r in rows[:n]:
        live = (f"live {r['live'][0]}-{r['live'][1]}/{r['live_of']}" if r["live"]
                else "in a loop body")
        lines.append(f"  {r['bytes'] / 2**20:9.1f} MiB x{r['count']:<3} {r['shape']:<24} {r['op']:<18} "
                     f"{live:<18} {r['source']:<40} {r['op_name']}")
    return lines


def temporaries_from_dump(dump_dir: str, module: str, hlo: str, top: int = 20) -> list[dict]:
    """`temporaries` of the module whose dump names contain `module` in `dump_dir` (the last
    one written, e.g. the train step); [] when XLA wrote no buffer assignment there."""
    def last(pattern):
        found = sorted(glob.glob(os.path.join(dump_dir, f"*{module}*{pattern}")),
                       key=os.path.getmtime)
        return found[-1] if found else None

    ba = last("buffer-assignment.txt")
    if ba is None:
        return []
    lr = last("live-range.txt")
    with open(ba) as f:
        text = f.read()
    live = ""
    if lr:
        with open(lr) as f:
            live = f.read()
    return temporaries(text, hlo, live, top)
