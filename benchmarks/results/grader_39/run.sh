#!/bin/bash
# issue 39 acceptance, as run from a fresh clone of the branch (TREE) with the project's venv (PY);
# BASE = `git archive a3a86d4` (the previous grader); OUT = a scratch directory.
set -x
cd "$TREE"
export PYTHONPATH="$TREE" JAX_PLATFORMS=cpu
uptime
timeout 600 $PY launch.py --experiment=env_generate --workdir=$OUT/w --set env.num_tasks=24 > $OUT/gen.log 2>&1; echo "gen rc=$?"
timeout 600 $PY launch.py --experiment=env_check --workdir=$OUT/w --set env.num_tasks=24 > $OUT/check.log 2>&1; echo "check rc=$?"
tail -2 $OUT/check.log
cp -r $OUT/w/pool $OUT/bench_pool
timeout 900 $PY benchmarks/sandbox_bench.py --base $BASE --only_grading --pool $OUT/bench_pool --rounds 4 --seconds 20 --out $OUT/sandbox_bench_grader_39.txt > $OUT/side.log 2>&1; echo "side rc=$?"
# a 3-task pool of stdlib fnmatch bug/feature tasks on CPython 3.13 (generate_pool with
# EnvConfig(python_versions=("3.13",), modules=("fnmatch",), kinds=("bug", "feature"), num_tasks=3))
timeout 300 $PY make_case_pool.py $OUT/case_pool fnmatch 3 > $OUT/case_pool.log 2>&1; echo "case pool rc=$?"
timeout 300 $PY benchmarks/sandbox_bench.py --attacks --pool $OUT/case_pool --out $OUT/attack_times_fnmatch.txt > $OUT/attacks.log 2>&1; echo "attacks rc=$?"
uptime
