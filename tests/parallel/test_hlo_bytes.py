"""The bytes-accessed estimate per HLO op (composer_jax.parallel.hlo_bytes) on module text in the
format libtpu writes: `%name#i` tuple-element operands, loops without known_trip_count."""
from composer_jax.parallel import hlo_bytes as hb

HLO = '''HloModule jit_traced, is_scheduled=true

%fused_slice (param_0: f32[15,256,256], param_1: s32[]) -> f32[1,256,256] {
  %param_0 = f32[15,256,256]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  ROOT %ds = f32[1,256,256]{2,1,0} dynamic-slice(%param_0, %param_1, %c0, %c0), dynamic_slice_sizes={1,256,256}
}

%fused_dus (param_0: bf16[15,256,256], param_1: bf16[1,256,256], param_2: s32[]) -> bf16[15,256,256] {
  %param_0 = bf16[15,256,256]{2,1,0} parameter(0)
  %param_1 = bf16[1,256,256]{2,1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %c0 = s32[] constant(0)
  ROOT %dus = bf16[15,256,256]{2,1,0} dynamic-update-slice(%param_0, %param_1, %param_2, %c0, %c0)
}

%cond (p: (s32[], f32[15,256,256], bf16[15,256,256])) -> pred[] {
  %p = (s32[], f32[15,256,256], bf16[15,256,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(15)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (wide.param: (s32[], f32[15,256,256], bf16[15,256,256])) -> (s32[], f32[15,256,256], bf16[15,256,256]) {
  %wide.param = (s32[], f32[15,256,256], bf16[15,256,256]) parameter(0)
  %w = f32[1,256,256]{2,1,0} fusion(%wide.param#1, %wide.param#0), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(traced)/jvp()/while/body/dynamic_slice"}
  %h = bf16[1,256,256]{2,1,0} convert(%w), metadata={op_name="jit(traced)/transpose(jvp())/while/body/convert_element_type"}
  %st = bf16[15,256,256]{2,1,0} fusion(%wide.param#2, %h, %wide.param#0), kind=kLoop, calls=%fused_dus
  %one = s32[] constant(1)
  %next = s32[] add(%wide.param#0, %one)
  ROOT %t = (s32[], f32[15,256,256], bf16[15,256,256]) tuple(%next, %wide.param#1, %st)
}

ENTRY %main (p0: f32[15,256,256], p1: bf16[15,256,256]) -> bf16[15,256,256] {
  %p0 = f32[15,256,256]{2,1,0} parameter(0)
  %p1 = bf16[15,256,256]{2,1,0} parameter(1)
  %z = s32[] constant(0)
  %init = (s32[], f32[15,256,256], bf16[15,256,256]) tuple(%z, %p0, %p1)
  %loop = (s32[], f32[15,256,256], bf16[15,256,256]) while(%init), condition=%cond, body=%body
  %out = bf16[15,256,256]{2,1,0} get-tuple-element(%loop), index=2
  ROOT %c = bf16[15,256,256]{2,1,0} copy(%out), metadata={op_name="jit(traced)/copy"}
}
'''
F32_LAYER = 4 * 256 * 256      # one layer's f32[1,256,256]
BF16_LAYER = 2 * 256 * 256


def test_trip_count_from_the_condition():
    comps = hb.computations(HLO)
    loop = next(ln for ln in comps["__entry__"] if " while(" in ln)
    assert hb.trip_count(loop, comps) == 15


def test_op_bytes_charges_slices_in_place_updates_and_trips():
    rows = {r["name"]: r for r in hb.op_bytes(HLO)}
    # moves nothing: parameters, constants, tuples, get-tuple-element, the while itself, add of
    # scalars is charged (12 bytes) but tiny
    assert set(rows) == {"w", "h", "st", "next", "c"}
    # the sliced read charges the slice (plus the s32 index), not the stacked [15, ...] operand
    assert rows["w"]["bytes"] == 15 * (F32_LAYER + 4 + F32_LAYER)
    assert rows["w"]["trips"] == 15 and rows["w"]["loops"] == (15,)
    # convert: reads f32, writes bf16, per iteration
    assert rows["h"]["bytes"] == 15 * (F32_LAYER + BF16_LAYER)
    # in-place dynamic-update-slice: reads the update and writes it, never the whole buffer
    assert rows["st"]["bytes"] == 15 * (BF16_LAYER + 4 + BF16_LAYER)
    assert rows["c"]["bytes"] == 2 * 15 * BF16_LAYER and rows["c"]["trips"] == 1
    assert rows["w"]["phase"] == "forward" and rows["h"]["phase"] == "backward"
    assert rows["c"]["phase"] == "other"
    assert rows["w"]["category"] == "fusion: gather/slice"
    assert rows["st"]["category"] == "fusion: dynamic-update-slice"
    assert rows["c"]["category"] == "copy/transpose"


def test_by_key_sums_and_ranks():
    totals = hb.by_key(hb.op_bytes(HLO), "category")
    assert list(totals)[0] == "fusion: gather/slice"
    assert sum(totals.values()) == sum(r["bytes"] for r in hb.op_bytes(HLO))


def test_tuple_element_shapes():
    shape = "(s32[], f32[2,3]{1,0}, /*index=2*/bf16[4]{0})"
    assert hb._tuple_elements(shape) == ["s32[]", "f32[2,3]{1,0}", "bf16[4]{0}"]
    assert hb._shape_of("t#2", {"t": shape}) == "bf16[4]{0}"
