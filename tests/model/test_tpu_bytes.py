"""What issue 44 changed for XLA:TPU's bytes accessed, checked on the traced programs (CPU only).

  * the MoE expert FFN's ragged dots return the compute dtype when traced for an accelerator
    (float32 accumulation inside the dot), so no float32 ragged-dot result, cotangent or weight
    gradient appears in the gradient's program; on CPU the program keeps its float32 results;
  * remat policies put no optimization barriers inside a rolled layer scan (prevent_cse=False,
    as MaxText under scan_layers) and keep them in an unrolled one.
"""
import re

import jax
import jax.numpy as jnp
import pytest

from composer_jax.config import ExecutionConfig, Remat, tiny
from composer_jax.model.layers import Ctx
from composer_jax.model.moe import dispatch_ragged, ragged_result_dtype
from composer_jax.model.transformer import _remat
from composer_jax.parallel.target import compiling_for

N, K, E, D, F = 24, 2, 4, 16, 8


def _ragged_dots(remat: str) -> list[tuple[str, str]]:
    """(result dtype, preferred_element_type) of every ragged_dot_general in the gradient of a
    bf16 MoE dispatch traced for TPU."""
    ks = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(ks[0], (N, D))
    idx = jax.random.randint(ks[1], (N, K), 0, E)
    wts = jax.nn.softmax(jax.random.normal(ks[2], (N, K)), -1)
    ws = [jnp.zeros(s) for s in [(E, D, F), (E, D, F), (E, F, D)]]
    ctx = Ctx(tiny(), ExecutionConfig(compute_dtype="bfloat16", remat=remat))

    def loss(x, *ws):
        return jnp.sum(dispatch_ragged(x, idx, wts, *ws, ctx).astype(jnp.float32))
    with compiling_for("tpu"):
        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, *ws))
    found = re.findall(r":(\w+)\[[\d,]*\] = ragged_dot_general\[[^\]]*?preferred_element_type=(.+)",
                       text)
    return [(dt, pet.strip()) for dt, pet in found]


@pytest.mark.parametrize("remat", ["none", "full"])
def test_ragged_dots_return_bf16_on_accelerators(remat):
    dots = _ragged_dots(remat)
    # 3 forward (gate, up, down) + 6 transposes (input and weight gradient of each): remat none
    # runs the `expert_ffn` op, the other policies its autodiff path
    assert len(dots) == 9, dots
    assert {dt for dt, _ in dots} == {"bf16"}, dots
    assert all("bfloat16" in pet for _, pet in dots), dots


def test_ragged_result_dtype_cpu_keeps_float32():
    assert ragged_result_dtype(jnp.bfloat16) == jnp.float32
    with compiling_for("tpu"):
        assert ragged_result_dtype(jnp.bfloat16) == jnp.bfloat16
        assert ragged_result_dtype(jnp.float32) == jnp.float32


@pytest.mark.parametrize("policy", [Remat.FULL, Remat.MINIMAL, Remat.DOTS])
def test_remat_barriers_only_when_unrolled(policy):
    def body(c, x):
        return jnp.sin(c) * x, None
    x = jnp.ones((3, 4))

    def scanned(unrolled):
        return str(jax.make_jaxpr(jax.grad(lambda c: jnp.sum(jax.lax.scan(
            _remat(body, policy, unrolled=unrolled), c, x)[0])))(jnp.ones(4)))
    assert "prevent_cse=False" in scanned(False) and "prevent_cse=True" not in scanned(False)
    assert "prevent_cse=True" in scanned(True)
