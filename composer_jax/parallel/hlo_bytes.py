"""Where a compiled step's memory traffic goes: an estimate of `bytes accessed` per HLO op.

Reads XLA's optimized module text (`compiled.as_text()` or the `*after_optimizations.txt` dump of
`--xla_dump_to`) and charges every top-level instruction (entry computation and the bodies of the
`while` loops, multiplied by their trip counts) with the bytes it reads and writes, as XLA's
HloCostAnalysis does: result bytes plus operand bytes, except that a fusion parameter read only
through (dynamic-)slices or gathers is charged the bytes of those slices, and an in-place
dynamic-update-slice writes only its update. Tuples, get-tuple-element, bitcasts, parameters,
constants and the `-done` halves of async pairs move nothing. Trip counts are read from the
loop's `known_trip_count` or, where the backend drops it (libtpu), from its condition's
`compare(counter, constant(N)), direction=LT`.

The estimate is for comparing two programs op class by op class; its total is checked against
the backend's own `bytes accessed` where it is printed (benchmarks/tpu_bytes_breakdown.py).

Shape glossary: none (text in, dicts out).
"""
from __future__ import annotations

import re

from composer_jax.parallel.hlo_stats import computations, shape_bytes, short_op_name

_INSTR = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z\-]*)\((.*)$")
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call",
         "conditional", "after-all", "partition-id", "replica-id", "iota", "opt-barrier",
         "optimization-barrier", "add-dependency"}
_COLLECTIVE = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
_SLICERS = ("dynamic-slice", "slice", "gather")


def _operands(rest: str) -> list[str]:
    """Operand names of an instruction, from the text after its opcode's '('."""
    depth, end = 1, len(rest)
    for i, ch in enumerate(rest):
        depth += ch == "(" and 1 or (ch == ")" and -1 or 0)
        if depth == 0:
            end = i
            break
    refs = re.findall(r"%([\w.\-]+)(?:#(\d+))?", rest[:end])
    return [n + (f"#{i}" if i else "") for n, i in refs]


def _tuple_elements(shape: str) -> list[str]:
    """The top-level elements of a tuple shape string '(a, b, ...)' ([shape] if not a tuple)."""
    if not shape.startswith("("):
        return [shape]
    parts, depth, start = [], 0, 1
    for j, ch in enumerate(shape):
        depth += ch in "([{" and 1 or (ch in ")]}" and -1 or 0)
        if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
            parts.append(re.sub(r"/\*index=\d+\*/", "", shape[start:j]).strip())
            start = j + 1
            if depth == 0:
                break
    return parts


def _shape_of(ref: str, shapes: dict[str, str]) -> str:
    """The shape of operand `ref` ('name' or 'name#i', libtpu's reference to a tuple element)."""
    name, _, idx = ref.partition("#")
    shape = shapes.get(name, "")
    if idx:
        parts = _tuple_elements(shape)
        return parts[int(idx)] if int(idx) < len(parts) else ""
    return shape


def _parse(lines: list[str]) -> list[tuple[str, str, str, list[str], str]]:
    """(name, shape, opcode, operand names, full line) of each instruction."""
    out = []
    for line in lines:
        m = _INSTR.match(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3), _operands(m.group(4)), line))
    return out


def trip_count(line: str, comps: dict[str, list[str]]) -> int:
    """A while loop's trip count: its known_trip_count, else the N of its condition's
    `compare(i, constant(N)), direction=LT` (counter from 0), else 1."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    if m:
        return int(m.group(1))
    cond = re.search(r"condition=%?([\w.\-]+)", line)
    body = _parse(comps.get(cond.group(1), [])) if cond else []
    consts = {n: re.search(r"constant\((-?\d+)\)", ln) for n, _, op, _, ln in body
              if op == "constant"}
    for _, _, op, ops, ln in body:
        if op == "compare" and "direction=LT" in ln:
            for o in ops:
                if consts.get(o):
                    return int(consts[o].group(1))
    for _, _, op, ops, ln in body:      # the compare fused with its constant
        if op == "fusion":
            called = re.search(r"calls=%?([\w.\-]+)", ln)
            inner = _parse(comps.get(called.group(1), [])) if called else []
            if any(o == "compare" and "direction=LT" in l for _, _, o, _, l in inner):
                vals = [re.search(r"constant\((-?\d+)\)", l) for _, _, o, _, l in inner
                        if o == "constant"]
                vals = [int(v.group(1)) for v in vals if v]
                if vals:
                    return max(vals)
    return 1


def _fusion_reads(called: list[str], operand_shapes: list[str]) -> tuple[list[int], int | None]:
    """Bytes read from each fusion operand, and the bytes written when the fusion's root is an
    in-place dynamic-update-slice (None otherwise)."""
    inner = _parse(called)
    shapes = {n: s for n, s, *_ in inner}
    params = {}
    for n, s, op, _, ln in inner:
        if op == "parameter":
            params[n] = int(re.search(r"parameter\((\d+)\)", ln).group(1))
    users: dict[str, list[tuple[str, str, int]]] = {}
    for n, s, op, ops, _ in inner:
        for i, o in enumerate(ops):
            users.setdefault(o, []).append((op, s, i))
    root = next((r for r in inner if r[4].lstrip().startswith("ROOT")),
                inner[-1] if inner else None)
    dus_target = root[3][0] if root and root[2] == "dynamic-update-slice" else None
    reads = [shape_bytes(s) for s in operand_shapes]
    for pname, idx in params.items():
        if idx >= len(reads):
            continue
        us = users.get(pname, [])
        if pname == dus_target:
            reads[idx] = 0
        elif us and all(op in _SLICERS and i == 0 for op, _, i in us):
            reads[idx] = min(reads[idx], sum(shape_bytes(s) for _, s, _ in us))
    written = None
    if dus_target is not None:
        written = shape_bytes(shapes.get(root[3][1], "")) if len(root[3]) > 1 else 0
    return reads, written


def _category(op: str, line: str, called: list[str]) -> str:
    kind = op.replace("-start", "")
    if kind in _COLLECTIVE:
        return kind
    if op == "custom-call":
        tgt = re.search(r'custom_call_target="([^"]+)"', line)
        return f"custom-call {tgt.group(1) if tgt else '?'}"
    if op in ("convolution", "dot"):
        return "matmul"
    if op in ("copy", "copy-start", "transpose"):
        return "copy/transpose"
    if op == "fusion":
        body = " ".join(called)
        if " convolution(" in body or " dot(" in body:
            return "fusion: matmul"
        if "kind=kCustom" in line or " custom-call(" in body:
            return "fusion: custom"
        root = next((ln for ln in called if ln.lstrip().startswith("ROOT")), "")
        if " dynamic-update-slice(" in root:
            return "fusion: dynamic-update-slice"
        if " scatter(" in body:
            return "fusion: scatter"
        if " gather(" in body or " dynamic-slice(" in body:
            return "fusion: gather/slice"
        if " reduce(" in body:
            return "fusion: reduce"
        if re.search(r" (copy|transpose)\(", root) or not re.search(
                r" (add|multiply|subtract|divide|exponential|convert|select|maximum|rsqrt)\(",
                body):
            return "fusion: copy/layout"
        return "fusion: elementwise"
    return op


def phase(op_name: str) -> str:
    """Which part of a train step a jax op_name belongs to: 'recompute' (a rematerialised forward
    inside the backward), 'backward', 'forward', or 'other' (optimizer, loss glue, layout ops XLA
    added without a name)."""
    if "rematted_computation" in op_name:
        return "recompute"
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "other"


def op_bytes(hlo: str) -> list[dict]:
    """Every instruction's estimated bytes accessed per step:
    [{"name", "op", "category", "bytes", "trips", "shape", "source"}]; "trips" is the product of
    the enclosing loops' trip counts (already in "bytes"), "source" the short jax op_name."""
    comps = computations(hlo)
    shapes = {}
    for lines in comps.values():
        for n, s, *_ in _parse(lines):
            shapes[n] = s
    rows: list[dict] = []

    def walk(comp: str, mult: int, depth: int, path: tuple = ()) -> None:
        if depth > 50:
            return
        for name, shape, op, ops, line in _parse(comps.get(comp, [])):
            if op == "while":
                body = re.search(r"body=%?([\w.\-]+)", line)
                if body:
                    t = trip_count(line, comps)
                    walk(body.group(1), mult * t, depth + 1, path + (t,))
                continue
            if op in ("call", "conditional"):
                for callee in re.findall(r"(?:to_apply|calls|branch_computations)=\{?%?([\w.\-]+)",
                                         line):
                    walk(callee, mult, depth + 1, path)
                continue
            if op in _FREE or op.endswith("-done"):
                continue
            called_name = re.search(r"calls=%?([\w.\-]+)", line)
            called = comps.get(called_name.group(1), []) if called_name and op == "fusion" else []
            operand_shapes = [_shape_of(o, shapes) for o in ops]
            out_shape = shape
            if op.endswith("-start") and shape.startswith("("):
                operand_shapes = []     # async pair: its tuple holds the operands and the result
            if op == "fusion":
                reads, written = _fusion_reads(called, operand_shapes)
                n = sum(reads) + (shape_bytes(out_shape) if written is None else written)
            elif op == "dynamic-update-slice":
                n = 2 * shape_bytes(operand_shapes[1]) if len(operand_shapes) > 1 else 0
            elif op in ("dynamic-slice", "slice", "gather"):
                n = 2 * shape_bytes(out_shape)
            else:
                n = sum(shape_bytes(s) for s in operand_shapes) + shape_bytes(out_shape)
            m = re.search(r'op_name="([^"]*)"', line)
            rows.append({"name": name, "op": op, "category": _category(op, line, called),
                         "bytes": n * mult, "trips": mult, "loops": path, "shape": shape[:80],
                         "phase": phase(m.group(1) if m else ""),
                         "source": short_op_name(m.group(1)) if m else ""})

    walk("__entry__", 1, 0)
    return rows


def by_key(rows: list[dict], key: str) -> dict[str, int]:
    """Total bytes per value of `key` ("category", "source", ...), largest first."""
    out: dict[str, int] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + r["bytes"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
