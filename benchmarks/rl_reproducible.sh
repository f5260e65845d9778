#!/bin/bash
# Issue 40's acceptance of the reproducible schedule on the README main command, from the
# repository root of a checkout (PY = the venv's python; RUNS = where the runs go):
#   bash benchmarks/rl_reproducible.sh [RUNS]
# Runs `launch.py --experiment=rl_async` (default seed) as RUNS/rl_async (skipped if it finished),
# then the same command again, with --set rl.job.backend=ray, and once SIGKILLed after its first
# checkpoint and resumed by the same command; compares each with the first run
# (`python -m composer_jax.rl.run_compare`: metrics rows without wall-clock fields, the consumed
# log, the final checkpoint arrays bit for bit; the resumed run ignores the weight-sync byte
# counts, which depend on where the delta chain restarted), then scores RUNS/rl_async@0 and
# RUNS/rl_async from the command line (`--experiment=eval`) and prints z of the difference.
set -u
PY=${PY:-.venv/bin/python}
RUNS=${1:-runs}
run() { "$PY" launch.py --experiment=rl_async --workdir="$@" > "${1}.log" 2>&1; echo "rc $? $1"; }
[ -f "$RUNS/rl_async/rl_summary.json" ] || run "$RUNS/rl_async"
run "$RUNS/rl_async_again"
run "$RUNS/rl_async_ray" --set rl.job.backend=ray
"$PY" launch.py --experiment=rl_async --workdir="$RUNS/rl_async_killed" > "$RUNS/rl_async_killed.log" 2>&1 &
pid=$!
until ls -d "$RUNS"/rl_async_killed/checkpoints/1* > /dev/null 2>&1 || ! kill -0 $pid 2>/dev/null; do sleep 0.5; done
sleep 3; kill -9 $pid; wait $pid 2>/dev/null
echo "SIGKILLed after checkpoints: $(ls "$RUNS/rl_async_killed/checkpoints" | tr '\n' ' ')"
run "$RUNS/rl_async_killed"
for other in rl_async_again rl_async_ray; do
  echo "== run_compare rl_async $other"
  "$PY" -m composer_jax.rl.run_compare "$RUNS/rl_async" "$RUNS/$other"; echo "rc $?"
done
echo "== run_compare rl_async rl_async_killed --ignore-transport"
"$PY" -m composer_jax.rl.run_compare "$RUNS/rl_async" "$RUNS/rl_async_killed" --ignore-transport; echo "rc $?"
for pol in "$RUNS/rl_async@0" "$RUNS/rl_async"; do
  "$PY" launch.py --experiment=eval --set eval.policy="$pol" --workdir="$RUNS/eval_$(basename "$pol" | tr @ _)" > /dev/null 2>&1
done
"$PY" - "$RUNS" <<'PYEOF'
import json, math, pathlib, sys
runs = pathlib.Path(sys.argv[1])
a = json.loads((runs / "eval_rl_async_0" / "eval.json").read_text())
b = json.loads((runs / "eval_rl_async" / "eval.json").read_text())
z = (b["eval_resolved_rate"] - a["eval_resolved_rate"]) / math.hypot(a["eval_resolved_se"], b["eval_resolved_se"])
print(f"eval from the command line: rl_async@0 (version {a['version']}) {a['eval_resolved_rate']:.3f} +- "
      f"{a['eval_resolved_se']:.3f}; rl_async (version {b['version']}) {b['eval_resolved_rate']:.3f} +- "
      f"{b['eval_resolved_se']:.3f}; z = {z:.2f}")
PYEOF
