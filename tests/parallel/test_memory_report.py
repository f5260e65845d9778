"""The per-buffer memory report (composer_jax.parallel.memory_report) on dump text in the formats
XLA:TPU writes (buffer assignment, optimized module with stack frames, live ranges)."""
from composer_jax.parallel import memory_report as mr

HLO = '''HloModule jit_traced, is_scheduled=true

FileNames
1 "/x/composer_jax/parallel/sharding.py"
2 "/x/composer_jax/model/transformer.py"

FunctionNames
1 "constrain"
2 "lm_logits"

FileLocations
1 {file_name_id=1 function_name_id=1 line=120 end_line=120 column=1 end_column=1}
2 {file_name_id=2 function_name_id=2 line=217 end_line=217 column=1 end_column=1}

StackFrames
1 {file_location_id=2 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=1}

ENTRY %main {
  %p0 = f32[64,129280]{1,0:T(8,128)} parameter(0)
  %fusion.7 = f32[16,32,32320]{2,1,0:T(8,128)} fusion(%p0), kind=kOutput, calls=%f, metadata={op_name="jit(traced)/while/body/...d,dv->...v/dot_general" stack_frame_id=1}
  %fusion.8 = f32[16,32,32320]{2,1,0:T(8,128)} fusion(%p0), kind=kOutput, calls=%f, metadata={op_name="jit(traced)/while/body/...d,dv->...v/dot_general" stack_frame_id=1}
  %copy.3 = f32[129280,64]{1,0:T(8,128)} copy(%p0)
  %all-to-all.2 = f32[4,64,32320]{2,1,0:T(8,128)} all-to-all(%p0), metadata={op_name="jit(traced)/sharding_constraint" stack_frame_id=2}
}
'''
BA = '''BufferAssignment:
allocation 0: size 33095680, parameter 0, shape |f32[64,129280]| at ShapeIndex {}:
 value: <1 p0 @0> (size=33095680,offset=0): f32[64,129280]{1,0:T(8,128)}
allocation 1: size 512, constant:
 value: <2 c @0> (size=512,offset=0): f32[]{:T(128)}
allocation 2: size 300000000, preallocated-temp:
 value: <3 fusion.7 @0> (size=66191360,offset=0): f32[16,32,32320]{2,1,0:T(8,128)}
 value: <4 fusion.8 @0> (size=66191360,offset=66191360): f32[16,32,32320]{2,1,0:T(8,128)}
 value: <5 copy.3 @0> (size=66191360,offset=132382720): f32[129280,64]{1,0:T(8,128)}
 value: <6 all-to-all.2 @0> (size=33095680,offset=198574080): f32[4,64,32320]{2,1,0:T(8,128)}
'''
LIVE = '''HloLiveRange (max 100):
  InstructionSequence:
    0:p0
  BufferLiveRange:
    copy.3{}:5-90
    all-to-all.2{}:40-42
  Live ranges at 41 (peak):
    copy.3{}: 66191360 bytes
'''


def test_temporaries_reads_values_sources_and_live_ranges():
    rows = mr.temporaries(BA, HLO, LIVE, top=10)
    # parameters and constants are not temporaries; one row per (size, shape, op, source, name)
    assert [(r["bytes"], r["count"]) for r in rows] == [(66191360, 2), (66191360, 1),
                                                         (33095680, 1)]
    logits, copy, a2a = rows
    assert logits["shape"] == "f32[16,32,32320]" and logits["op"] == "fusion:kOutput"
    assert logits["source"] == "model/transformer.py:217 (lm_logits)"
    assert logits["op_name"].endswith("dot_general") and logits["live"] is None
    assert copy["op"] == "copy" and copy["live"] == (5, 90) and copy["live_of"] == 100
    assert copy["op_name"].startswith("(layout change") and copy["layout"] == "{1,0:T(8,128)}"
    # made inside the sharding helper: the caller's line (the frame's parent) is reported
    assert a2a["source"] == "model/transformer.py:217 (lm_logits)" and a2a["live"] == (40, 42)
    lines = mr.format_rows(rows)
    assert len(lines) == 3 and "63.1 MiB x2" in lines[0] and "live 5-90/100" in lines[1]
