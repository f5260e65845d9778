#!/bin/bash
# issue 39 acceptance, run from a frozen copy of the branch (/tmp/i39_new2)
set -x
cd /tmp/i39_new2
export PYTHONPATH=/tmp/i39_new2 JAX_PLATFORMS=cpu
PY=/work/main/.venv/bin/python
uptime
timeout 600 $PY launch.py --experiment=env_generate --workdir=/tmp/i39_final/w --set env.num_tasks=24 > /tmp/i39_final/gen.log 2>&1; echo "gen rc=$?"
timeout 600 $PY launch.py --experiment=env_check --workdir=/tmp/i39_final/w --set env.num_tasks=24 > /tmp/i39_final/check.log 2>&1; echo "check rc=$?"
tail -2 /tmp/i39_final/check.log
cp -r /tmp/i39_final/w/pool /tmp/i39_final/bench_pool
timeout 900 $PY benchmarks/sandbox_bench.py --base /tmp/i39_base --only_grading --pool /tmp/i39_final/bench_pool --rounds 4 --seconds 20 --out /tmp/i39_final/sandbox_bench_grader_39.txt > /tmp/i39_final/side.log 2>&1; echo "side rc=$?"
timeout 300 $PY /tmp/i39_mkpool2.py /tmp/i39_final/case_pool fnmatch 3 > /tmp/i39_final/case_pool.log 2>&1; echo "case pool rc=$?"
timeout 300 $PY benchmarks/sandbox_bench.py --attacks --pool /tmp/i39_final/case_pool --out /tmp/i39_final/attack_times_fnmatch.txt > /tmp/i39_final/attacks.log 2>&1; echo "attacks rc=$?"
uptime
