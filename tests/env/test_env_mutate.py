import ast
import random

from composer_jax.env.tasks import mutate

SRC = '''def f(a, b, items):
    """Doc."""
    total = a + b * 2
    if a < b and b != 0:
        total -= 1
    while total > 10:
        total = total // 2
    flag = True
    x = items[1:3]
    log(a, b)
    return pow(total, 2) + len(x) % 5


X = 1 + 2
'''


def _applied(m):
    return mutate.apply(SRC, [m])


def test_every_operator_fires_and_edits_minimally():
    ms = mutate.enumerate_mutations(SRC)
    ops = {m.operator for m in ms}
    assert ops == set(mutate.OPERATORS)
    for m in ms:
        new = _applied(m)
        assert mutate.is_valid(SRC, [m]), m
        changed = [(a, b) for a, b in zip(SRC.splitlines(), new.splitlines()) if a != b]
        assert len(changed) <= 1 or m.operator == "remove_statement", (m, changed)
        assert m.function == "f"  # module-level code (X = 1 + 2) is never mutated


def test_specific_mutations():
    by = {}
    for m in mutate.enumerate_mutations(SRC):
        by.setdefault(m.operator, []).append(_applied(m))
    assert any("a - b * 2" in s for s in by["binop_swap"])
    assert any("if a <= b and" in s for s in by["compare_flip"])
    assert any("a < b or b != 0" in s for s in by["boolop_swap"])
    assert any("items[1:4]" in s or "items[2:3]" in s for s in by["off_by_one"])
    assert any("if not (a < b and b != 0):" in s for s in by["negate_condition"])
    assert any("flag = False" in s for s in by["flip_constant"])
    assert any("log(b, a)" in s for s in by["swap_arguments"])
    assert any("log(a, b)" not in s for s in by["remove_statement"])


def test_multiple_non_overlapping_mutations_apply_together():
    ms = mutate.enumerate_mutations(SRC)
    rng = random.Random(0)
    picked = []
    for m in rng.sample(ms, len(ms)):
        if all(not mutate.overlaps(m, p) for p in picked):
            picked.append(m)
        if len(picked) == 3:
            break
    new = mutate.apply(SRC, picked)
    ast.parse(new)
    assert new != SRC


def test_real_stdlib_module_has_many_sites():
    import pathlib
    from composer_jax.env.pythons import find_pythons
    py = next(iter(find_pythons().values()))
    src = pathlib.Path(py.stdlib, "getopt.py").read_text()
    ms = mutate.enumerate_mutations(src)
    assert len(ms) > 50
    valid = [m for m in ms if mutate.is_valid(src, [m])]
    assert len(valid) >= 0.9 * len(ms)
