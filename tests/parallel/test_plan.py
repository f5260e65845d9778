"""The planner's HLO readers and its native-grouped-GEMM stand-in for ragged_dot."""
import os
import subprocess
import sys
import textwrap

from composer_jax.parallel.hlo_stats import collective_stats, peak_buffers, shape_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HLO = textwrap.dedent("""\
    %body (p: (s32[], bf16[8,4])) -> (s32[], bf16[8,4]) {
      %ag = bf16[8,4]{1,0} all-gather(%x), dimensions={0}, metadata={op_name="jit(traced)/while/body/eval_jaxpr/add"}
      %ar = f32[8,4]{1,0} all-reduce(%y), to_apply=%region_0.0_promoted, metadata={op_name="jit(traced)/jvp()/psum"}
    }

    ENTRY %main (a: bf16[8,4]) -> bf16[8,4] {
      %a = bf16[8,4]{1,0} parameter(0), metadata={op_name="args[0]['w']"}
      %w = (s32[], bf16[8,4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
      %big = f32[16,16]{1,0} fusion(%a), kind=kLoop, calls=%f, metadata={op_name="jit(traced)/transpose(jvp())/dot_general"}
    }
    """)


def test_collective_bytes_scale_with_trip_count_and_undo_cpu_promotion():
    totals, top = collective_stats(HLO)
    assert totals == {"all-gather": 3 * 64, "all-reduce": 3 * 64}   # f32 promoted: 2 B/elem
    assert top[0]["op"] in ("add", "psum")
    assert shape_bytes("(f32[2,3], bf16[4])") == 24 + 8


def test_peak_buffers_group_by_op():
    live = textwrap.dedent("""\
        Live ranges at 7 (peak):
            big{}: 1024 bytes (cumulative: 1024 bytes)
            a{}: 64 bytes (cumulative: 1088 bytes)
          Stack trace breakdown for peak usage: 1088 bytes
        """)
    peak = peak_buffers(live, HLO)
    assert peak[0] == {"bytes": 1024, "count": 1, "shape": "f32[16,16]", "op": "dot_general"}
    assert peak[1]["op"] == "args[0]['w']"


def test_grouped_gemm_stand_in_has_native_shapes_and_memory():
    """In a fresh process (the stand-in replaces ragged_dot's CPU lowering process-wide)."""
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from composer_jax.train.plan import use_native_grouped_gemm_memory
        x = jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((32, 256, 128), jnp.bfloat16)
        gs = jax.ShapeDtypeStruct((32,), jnp.int32)
        def loss(x, w, gs):
            y = jax.lax.ragged_dot(x, w, gs, preferred_element_type=jnp.float32)
            return jnp.sum(y.astype(jnp.bfloat16))
        f = jax.jit(jax.grad(loss, argnums=(0, 1)))
        dense = f.lower(x, w, gs).compile().memory_analysis().temp_size_in_bytes
        use_native_grouped_gemm_memory()
        f = jax.jit(jax.grad(loss, argnums=(0, 1)))
        out = jax.eval_shape(f, x, w, gs)
        native = f.lower(x, w, gs).compile().memory_analysis().temp_size_in_bytes
        print(dense, native, out[0].shape, out[1].shape)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dense, native, gx, gw = proc.stdout.split(maxsplit=3)
    assert "(4096, 256) (32, 256, 128)" == f"{gx} {gw}".strip()
    # dense lowering: [G, M, ...] buffers; native: a few [M, ...] buffers
    assert int(native) * 8 < int(dense), (native, dense)
