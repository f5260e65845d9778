"""Blackwell (sm_100) variant of the block-scaled matmul: the native block-scaled tcgen05 MMA.

JAX 0.12 exposes Blackwell's block-scaled MMA in Pallas Mosaic GPU as
`plgpu.tcgen05_mma(acc, a, b, barrier, a_scale=..., b_scale=...)` (jax/_src/pallas/mosaic_gpu/
primitives.py; checks in jax/experimental/mosaic/gpu/tcgen05.py `mma`): MXFP8 is float8_e4m3fn
data with float8_e8m0fnu scales per 32 elements of K (kind::mxf8f6f4), NVFP4 is float4_e2m1fn
data with float8_e4m3fn scales per 16 (kind::mxf4nvf4). The scales live in tensor memory (TMEM)
in the `TMEMLayout.SCALES_LAYOUT` layout and arrive there from shared memory with
`plgpu.async_copy_scales_to_tmem`, which wants them in 32x16-byte chunks (`tcgen05_scale_layout`).

Glossary: M rows, K contraction, N columns, bs scale block (32 MXFP8, 16 NVFP4), KB = K / bs,
R the rows of a scale matrix (M for A, N for B), bm x bn output tile, bk the K step of one
pipeline stage, kbs = bk / bs scales per row per step.

Contract (as block_matmul.block_scaled_matmul): a [M, K] float8_e4m3fn (NVFP4: E2M1 values held
in E4M3, converted here to float4_e2m1fn, exact), sa [M, KB], b [K, N], sb [KB, N] (E8M0 bytes as
uint8, or E4M3), optional FP32 global scale applied once at the end. Output float32 [M, N].

How it runs (one CTA per (bm, bn) output tile, one warpgroup): a `STAGES`-deep TMA pipeline
brings A [bm, bk], B^T [bn, bk] and both scale chunks into shared memory; per K step one thread
copies the scales to TMEM and issues the block-scaled MMA into a float32 TMEM accumulator
(accumulate=False on the first step), then refills the previous step's slot once that step's MMA
has signalled completion, so one MMA stays queued while the thread waits; the epilogue moves
TMEM -> registers -> SMEM -> GMEM. Every slot has its own TMEM scale buffers, rewritten only
after the slot's previous MMA completed (an MMA -> scale-copy order is not among tcgen05's
implicitly pipelined pairs). B is passed K-major ([N, K]): 4-bit block-scaled MMA requires K-fastest operands.

Padding: M to bm, N to bn, K to bk with zero data and unit scales (exact: zeros add nothing).
Numerics: the tensor core sums a K step's scaled products in its own order, so results equal the
reference (composer_jax.quant.blockwise) up to float32 summation order, not bit for bit; an E8M0
scale byte 0 is 2**-127 in hardware where the reference's XLA arithmetic flushes it to zero
(only products below ~1e-70 differ); a NaN scale gives NaN as in the reference.
Testing: JAX 0.12's Mosaic GPU interpreter does not implement scaled tcgen05 MMA or scale copies
(interpret/gpu_callbacks.py: "TODO: Support scales"), so this kernel has no interpret mode; it is
checked by lowering for cuda with a Blackwell abstract device (pallas_kernels.lowering) and by
benchmarks/quant_kernels_gpu.py on a Blackwell GPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import common

TMEM_ROWS = 128          # rows of one 1-CTA block-scaled MMA (TMEM lanes)
CHUNK_ROWS = 32          # a scale chunk is 32 rows x 16 bytes: 4 row groups x 4 K blocks
CHUNK_K = 4              # scale columns (K blocks) per chunk
STAGES = 3               # TMA pipeline depth (slots in flight)
BN = 128                 # output tile columns (a multiple of 8, <= 256)
# (block size, scale kind) -> (MMA element dtype, scale dtype, K step bk): bk is one 128-byte
# swizzle row of data (128 fp8 or 256 fp4 values), the MMA's K group.
FORMATS = {
    (32, "e8m0"): (jnp.float8_e4m3fn, jnp.float8_e8m0fnu, 128),
    (16, "e4m3"): (jnp.float4_e2m1fn, jnp.float8_e4m3fn, 256),
}
UNIT_SCALE = {"e8m0": 127, "e4m3": 1.0}  # padding scale: 2**0 / 1.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static tiling of one problem: padded sizes and tile counts."""

    bs: int
    bk: int
    elem: object
    scale: object
    mp: int
    np_: int
    kp: int

    @property
    def kbs(self) -> int:
        """Scale columns per K step."""
        return self.bk // self.bs

    @property
    def nk(self) -> int:
        return self.kp // self.bk


def check_format(block_size: int, scale_kind: str) -> tuple:
    """(element dtype, scale dtype, bk) for a supported format; a ValueError names the valid ones."""
    key = (block_size, scale_kind)
    if key not in FORMATS:
        raise ValueError(f"blackwell block-scaled MMA supports (block_size, scale_kind) in "
                         f"{sorted(FORMATS)}, got {key}")
    return FORMATS[key]


def make_plan(m: int, k: int, n: int, block_size: int, scale_kind: str) -> Plan:
    elem, scale, bk = check_format(block_size, scale_kind)
    return Plan(block_size, bk, elem, scale, common.round_up(m, TMEM_ROWS), common.round_up(n, BN),
                common.round_up(k, bk))


def tcgen05_scale_layout(s: jax.Array, kb_multiple: int = CHUNK_K, fill=0) -> jax.Array:
    """Scales [..., R, KB] (one row per M or N index) -> the SMEM chunk layout [..., Rt, KBc, 32, 16].

    Rt = ceil(R / 128), KBc = ceil(KB / kb_multiple) * kb_multiple / 4 (kb_multiple a multiple of 4);
    R and KB are padded with `fill`. Chunk (t, c) holds rows 128t .. 128t+127 and scale columns
    4c .. 4c+3 as out[t, c, r, 4q + j] = s[128t + 32q + r, 4c + j]: row r of a chunk carries the
    scales of rows r, r+32, r+64, r+96. This is the SMEM layout that plgpu.async_copy_scales_to_tmem
    (jax.experimental.mosaic.gpu.tcgen05.async_copy_scales_smem_to_tmem) copies into a TMEM ref of
    shape [128 * Rt, KB] in TMEMLayout.SCALES_LAYOUT, for MXFP8 and NVFP4 alike.
    """
    if s.ndim < 2:
        raise ValueError(f"scales must have shape [..., R, KB], got {s.shape}")
    if kb_multiple % CHUNK_K:
        raise ValueError(f"kb_multiple must be a multiple of {CHUNK_K}, got {kb_multiple}")
    *lead, r, kb = s.shape
    rp, kbp = common.round_up(r, TMEM_ROWS), common.round_up(kb, kb_multiple)
    s = common.pad_to(s, (*lead, rp, kbp), fill)
    q = TMEM_ROWS // CHUNK_ROWS
    s = s.reshape(*lead, rp // TMEM_ROWS, q, CHUNK_ROWS, kbp // CHUNK_K, CHUNK_K)
    n = len(lead)
    s = jnp.moveaxis(s, (n + 3, n + 2, n + 1), (n + 1, n + 2, n + 3))  # [.., t, c, r, q, j]
    return s.reshape(*lead, rp // TMEM_ROWS, kbp // CHUNK_K, CHUNK_ROWS, q * CHUNK_K)


def from_tcgen05_scale_layout(chunks: jax.Array, rows: int, kb: int) -> jax.Array:
    """Inverse of `tcgen05_scale_layout`: [..., Rt, KBc, 32, 16] -> [..., rows, kb] (padding dropped)."""
    *lead, rt, kbc, cr, cw = chunks.shape
    q = TMEM_ROWS // CHUNK_ROWS
    if (cr, cw) != (CHUNK_ROWS, q * CHUNK_K):
        raise ValueError(f"not a scale chunk layout: {chunks.shape}")
    n = len(lead)
    s = chunks.reshape(*lead, rt, kbc, CHUNK_ROWS, q, CHUNK_K)
    s = jnp.moveaxis(s, (n + 1, n + 2, n + 3), (n + 3, n + 2, n + 1))  # [.., t, q, r, c, j]
    return s.reshape(*lead, rt * TMEM_ROWS, kbc * CHUNK_K)[..., :rows, :kb]


def scale_operand(s: jax.Array, scale_kind: str, plan: Plan) -> jax.Array:
    """Kernel scales (E8M0 bytes or E4M3) [..., R, KB] -> MMA scale dtype in the chunk layout."""
    if scale_kind == "e8m0":
        if s.dtype != jnp.uint8:
            raise ValueError(f"e8m0 scales must be uint8 bytes, got {s.dtype}")
        return lax.bitcast_convert_type(tcgen05_scale_layout(s, plan.kbs, UNIT_SCALE[scale_kind]),
                                        jnp.float8_e8m0fnu)
    if s.dtype != jnp.float8_e4m3fn:
        raise ValueError(f"e4m3 scales must be float8_e4m3fn, got {s.dtype}")
    return tcgen05_scale_layout(s, plan.kbs, UNIT_SCALE[scale_kind])


def data_operand(x: jax.Array, rows: int, plan: Plan) -> jax.Array:
    """K-major data [..., R, K] (E4M3 storage) -> MMA element dtype, padded to [..., rows, Kp].

    NVFP4's E2M1 values are exact in float4_e2m1fn; values off the E2M1 grid break the kernel
    contract (they would be rounded here)."""
    if x.dtype != jnp.float8_e4m3fn:
        raise ValueError(f"block-scaled data must be float8_e4m3fn, got {x.dtype}")
    x = common.pad_to(x, (*x.shape[:-2], rows, plan.kp))
    return x if plan.elem == jnp.float8_e4m3fn else x.astype(plan.elem)


def _smem_transforms(dtype, minor: int):
    """Tiling + 128-byte swizzle for an SMEM tile whose minor dimension holds `minor` elements."""
    bits = jnp.finfo(dtype).bits
    swizzle = plgpu.find_swizzle(minor * bits)
    return (plgpu.TilingTransform((8, 8 * swizzle // bits)), plgpu.SwizzleTransform(swizzle))


def scratch_types(plan: Plan) -> dict:
    """SMEM buffers, TMEM accumulator and scale buffers, and barriers of one CTA."""
    chunks = plan.kbs // CHUNK_K
    tmem_scales = lambda rows: tuple(  # noqa: E731
        plgpu.TMEM((rows, plan.kbs), plan.scale, layout=plgpu.TMEMLayout.SCALES_LAYOUT)
        for _ in range(STAGES))
    return dict(
        a_smem=plgpu.SMEM((STAGES, TMEM_ROWS, plan.bk), plan.elem,
                          transforms=_smem_transforms(plan.elem, plan.bk)),
        b_smem=plgpu.SMEM((STAGES, BN, plan.bk), plan.elem,
                          transforms=_smem_transforms(plan.elem, plan.bk)),
        sa_smem=plgpu.SMEM((STAGES, 1, chunks, CHUNK_ROWS, 16), plan.scale),
        sb_smem=plgpu.SMEM((STAGES, BN // TMEM_ROWS, chunks, CHUNK_ROWS, 16), plan.scale),
        sa_tmem=tmem_scales(TMEM_ROWS),
        sb_tmem=tmem_scales(common.round_up(BN, TMEM_ROWS)),
        acc_tmem=plgpu.TMEM((TMEM_ROWS, BN), jnp.float32),
        out_smem=plgpu.SMEM((TMEM_ROWS, BN), jnp.float32, transforms=_smem_transforms(jnp.float32, BN)),
        loaded=plgpu.Barrier(num_arrivals=4, num_barriers=STAGES),
        consumed=plgpu.Barrier(num_arrivals=1, num_barriers=STAGES, orders_tensor_core=True),
        done=plgpu.Barrier(orders_tensor_core=True),
    )


def mma_tile(a_gmem, b_gmem, sa_gmem, sb_gmem, out_gmem, scratch: dict, *, i, j, plan: Plan):
    """out[i-th bm rows, j-th bn columns] = block-scaled A @ B over all K steps (one CTA).

    a_gmem [Mp, Kp], b_gmem [Np, Kp] (K-major), sa_gmem [Mp/128, KBp/4, 32, 16],
    sb_gmem [Np/128, KBp/4, 32, 16]; i, j traced tile indices.
    """
    s = scratch
    chunks = plan.kbs // CHUNK_K
    bt = BN // TMEM_ROWS

    def fetch(kk, slot: int):
        ks = pl.ds(kk * plan.bk, plan.bk)
        kc = pl.ds(kk * chunks, chunks)
        bar = s["loaded"].at[slot]
        plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(i * TMEM_ROWS, TMEM_ROWS), ks], s["a_smem"].at[slot], bar)
        plgpu.copy_gmem_to_smem(b_gmem.at[pl.ds(j * BN, BN), ks], s["b_smem"].at[slot], bar)
        plgpu.copy_gmem_to_smem(sa_gmem.at[pl.ds(i, 1), kc], s["sa_smem"].at[slot], bar)
        plgpu.copy_gmem_to_smem(sb_gmem.at[pl.ds(j * bt, bt), kc], s["sb_smem"].at[slot], bar)

    def step(kk, slot: int):
        plgpu.barrier_wait(s["loaded"].at[slot])
        plgpu.async_copy_scales_to_tmem(s["sa_smem"].at[slot], s["sa_tmem"][slot])
        plgpu.async_copy_scales_to_tmem(s["sb_smem"].at[slot], s["sb_tmem"][slot])
        plgpu.tcgen05_mma(s["acc_tmem"], s["a_smem"].at[slot], s["b_smem"].at[slot].T,
                          s["consumed"].at[slot], a_scale=s["sa_tmem"][slot],
                          b_scale=s["sb_tmem"][slot], accumulate=kk > 0)
        prev = (slot - 1) % STAGES  # step kk-1's slot: refill it while MMA kk is queued

        @pl.when((kk >= 1) & (kk - 1 + STAGES < plan.nk))
        def _():
            plgpu.barrier_wait(s["consumed"].at[prev])  # MMA kk-1 has read its operands
            fetch(kk - 1 + STAGES, prev)

    for slot in range(min(STAGES, plan.nk)):
        fetch(slot, slot)

    def rounds(r, carry):  # STAGES steps per round, so every slot index is static
        for slot in range(STAGES):
            kk = r * STAGES + slot

            @pl.when(kk < plan.nk)
            def _():
                step(kk, slot)
        return carry

    lax.fori_loop(0, -(-plan.nk // STAGES), rounds, 0)
    plgpu.tcgen05_commit_arrive(s["done"])
    plgpu.barrier_wait(s["done"])
    s["out_smem"][...] = plgpu.async_load_tmem(s["acc_tmem"])
    plgpu.wait_load_tmem()
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(s["out_smem"], out_gmem.at[pl.ds(i * TMEM_ROWS, TMEM_ROWS), pl.ds(j * BN, BN)])
    plgpu.wait_smem_to_gmem(0)


def check_target() -> None:
    """Raise a clear error unless the lowering target is a tcgen05 GPU (compute capability 10.x/11.x).

    Reads the architecture the way Mosaic GPU does (the default device, or the abstract mesh's
    device when lowering from CPU, see pallas_kernels.lowering); sm_90 and older have no tcgen05.
    """
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    major, minor = mgpu_utils._infer_arch()
    if major not in (10, 11):
        raise ValueError(f"the blackwell kernel variant needs a tcgen05 GPU (compute capability 10.x), "
                         f"but the target is {major}.{minor}; use variant='hopper' there")


def apply_global(out: jax.Array, global_scale) -> jax.Array:
    return out if global_scale is None else out * jnp.asarray(global_scale, jnp.float32).reshape(())


def no_interpret(interpret: bool) -> None:
    if interpret:
        raise ValueError("the blackwell kernel variant has no interpret mode (JAX 0.12's Mosaic GPU "
                         "interpreter lacks block-scaled tcgen05_mma); use variant='portable' on CPU")


def launch(a_op, b_op, sa_op, sb_op, plan: Plan) -> jax.Array:
    """The kernel on prepared operands (see `matmul`) -> float32 [Mp, Np]."""
    def body(a_gmem, b_gmem, sa_gmem, sb_gmem, out_gmem, **scratch):
        mma_tile(a_gmem, b_gmem, sa_gmem, sb_gmem, out_gmem, scratch,
                 i=lax.axis_index("m"), j=lax.axis_index("n"), plan=plan)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((plan.mp, plan.np_), jnp.float32),
        grid=(plan.mp // TMEM_ROWS, plan.np_ // BN), grid_names=("m", "n"),
        scratch_types=scratch_types(plan), kernel_name="block_scaled_matmul_blackwell",
    )(a_op, b_op, sa_op, sb_op)


def matmul(a, sa, b, sb, global_scale, *, block_size: int, scale_kind: str, interpret: bool) -> jax.Array:
    """Blackwell block-scaled matmul; same contract as block_matmul.block_scaled_matmul.

    Prepares a [Mp, Kp] and B^T [Np, Kp] in the MMA element type and both scales in the chunk
    layout, runs `launch`, slices [M, N] and applies the global scale.
    """
    no_interpret(interpret)
    check_target()
    m, k = a.shape
    n = b.shape[1]
    plan = make_plan(m, k, n, block_size, scale_kind)
    out = launch(data_operand(a, plan.mp, plan), data_operand(b.T, plan.np_, plan),
                 scale_operand(sa, scale_kind, plan), scale_operand(sb.T, scale_kind, plan), plan)
    return apply_global(out[:m, :n], global_scale)
