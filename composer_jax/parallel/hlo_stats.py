"""What a compiled step moves and keeps: collective bytes and the buffers live at the memory peak.

Both read XLA's text dumps of the optimized HLO module (`compiled.as_text()`) and, for the peak, the
`*-live-range.txt` file XLA writes next to it with `--xla_dump_to` (the buffers live at the peak of
the buffer assignment, with their sizes).

Collective bytes are the result bytes of every all-gather, all-reduce, reduce-scatter, all-to-all
and collective-permute, with ops inside `while` loops (layer scan, microbatch scan) multiplied by
the loop's known trip count. XLA:CPU widens bf16 all-reduces to f32 (their reducer is renamed
`*_promoted`); those are counted at the 2 bytes per element an accelerator moves.

Shape glossary: none (text in, dicts out).
"""
from __future__ import annotations

import math
import re

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
               "f64": 8, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
               "f8e4m3": 1, "f8e8m0fnu": 1, "f4e2m1fn": 1}
_INSTR = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z\-]+)\(")
# jaxpr wrappers that only add noise to an op_name
_NOISE = {"eval_jaxpr", "while", "body", "checkpoint", "rematted_computation", "jvp()",
          "transpose(jvp())", "jit(traced)"}


def shape_bytes(text: str) -> int:
    """Bytes of every `dtype[dims]` in an HLO shape string (tuples summed)."""
    total = 0
    for dt, dims in re.findall(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]", text):
        if dt in DTYPE_BYTES:
            total += DTYPE_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def computations(hlo: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines; the entry computation also as '__entry__'."""
    comps: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            name = m.group(1)
            comps[name] = []
            if line.startswith("ENTRY"):
                comps["__entry__"] = comps[name]
        elif name is not None:
            comps[name].append(line)
    return comps


def short_op_name(op_name: str, keep: int = 4) -> str:
    """The last `keep` meaningful components of a JAX op_name (what the op was in the model)."""
    parts = [p for p in op_name.split("/") if p and p not in _NOISE]
    return "/".join(parts[-keep:])


def _op_name(line: str) -> str:
    m = re.search(r'op_name="([^"]*)"', line)
    return m.group(1) if m else ""


def _walk(comps, comp, mult, visit, depth=0):
    """Calls visit(line, name, shape, op, mult) for every instruction reachable from `comp`, with
    mult the product of the enclosing while loops' known trip counts."""
    if depth > 50:
        return
    for line in comps.get(comp, []):
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, op = m.groups()
        visit(line, name, shape, op, mult)
        if op == "while":
            body = re.search(r"body=%?([\w.\-]+)", line)
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            if body:
                _walk(comps, body.group(1), mult * (int(trip.group(1)) if trip else 1), visit,
                      depth + 1)
        if op in ("call", "conditional", "async-start"):
            for callee in re.findall(r"(?:to_apply|calls|branch_computations)=\{?%?([\w.\-]+)",
                                     line):
                _walk(comps, callee, mult, visit, depth + 1)


def _collective_bytes_of(line: str, shape: str) -> int:
    n = shape_bytes(shape)
    if re.search(r"to_apply=%?[\w.\-]*promoted", line) and "f32[" in shape:
        n //= 2     # a bf16 all-reduce XLA:CPU widened to f32
    return n


def collective_stats(hlo: str, top: int = 12) -> tuple[dict[str, int], list[dict]]:
    """(bytes per collective kind per step per device, the `top` biggest sources by op_name)."""
    comps = computations(hlo)
    totals: dict[str, int] = {}
    sources: dict[tuple[str, str], int] = {}

    def visit(line, name, shape, op, mult):
        kind = op.replace("-start", "")
        if kind in COLLECTIVES and not op.endswith("-done"):
            n = mult * _collective_bytes_of(line, shape)
            totals[kind] = totals.get(kind, 0) + n
            key = (kind, short_op_name(_op_name(line)))
            sources[key] = sources.get(key, 0) + n

    _walk(comps, "__entry__", 1, visit)
    ranked = sorted(sources.items(), key=lambda kv: -kv[1])[:top]
    return totals, [{"kind": k, "op": s, "bytes": n} for (k, s), n in ranked]


def instruction_info(hlo: str) -> dict[str, tuple[str, str, str]]:
    """Instruction name -> (result shape, op_name metadata, first operand's name)."""
    info = {}
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m:
            operand = re.match(r"\s*%?([\w.\-]+)", line[m.end():])
            info[m.group(1)] = (m.group(2), _op_name(line), operand.group(1) if operand else "")
    return info


def _describe(name: str, info: dict, hops: int = 4) -> str:
    """What made instruction `name`: its op_name, else (copies, broadcasts, layout changes XLA
    added) the op_name of the first operand that has one, marked 'via'."""
    seen = name
    for i in range(hops):
        shape, op_name, operand = info.get(name, ("", "", ""))
        if op_name:
            return short_op_name(op_name) + (f" (via {seen})" if i else "")
        if not operand:
            break
        name = operand
    return seen


def _element_shape(shape: str, index: str) -> str:
    """The shape of tuple element `index` ('2' or '1,0') of an HLO shape string, or the shape."""
    for i in (int(x) for x in index.split(",") if x):
        if not shape.startswith("("):
            break
        parts, depth, start = [], 0, 1
        for j, ch in enumerate(shape):
            depth += ch in "([" and 1 or (ch in ")]" and -1 or 0)
            if (ch == "," and depth == 1) or j == len(shape) - 1:
                parts.append(shape[start:j].strip())
                start = j + 1
        shape = parts[i] if i < len(parts) else shape
    return shape[:90]


def peak_buffers(live_range_text: str, hlo: str, top: int = 40) -> list[dict]:
    """The biggest buffers live at the memory peak, grouped by what produced them.

    live_range_text: XLA's `*-live-range.txt` dump ('Live ranges at N (peak):' section). Returns
    [{"bytes", "count", "shape", "op"}] sorted by bytes (count = buffers in the group)."""
    m = re.search(r"Live ranges at \d+ \(peak\):\n(.*?)(?:\n\S|\n  \S|\Z)", live_range_text,
                  re.S)
    if not m:
        return []
    info = instruction_info(hlo)
    groups: dict[tuple[str, str], list[int]] = {}
    for name, index, nbytes in re.findall(r"^\s+([\w.\-]+)\{([\d,]*)\}: (\d+) bytes",
                                          m.group(1), re.M):
        full = re.sub(r"\{[\d,]*\}", "", info.get(name, ("",))[0])
        shape = _element_shape(full, index)
        what = _describe(name, info)
        if full.startswith("("):      # an element of a while loop's state (carry, stacked xs)
            what = f"loop state ({what})"
        g = groups.setdefault((what, shape), [0, 0])
        g[0] += int(nbytes)
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"bytes": b, "count": c, "shape": shape, "op": what}
            for (what, shape), (b, c) in ranked]
