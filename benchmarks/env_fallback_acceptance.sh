#!/usr/bin/env bash
# The environment on the fallback backend (issue 32), end to end through launch.py:
#   1. env_generate + env_check on env.sandbox_backend=fallback (24 tasks, default CPythons);
#   2. env_generate with a broken CPython (a hard-linked copy of the newest one whose unittest
#      raises on import, found first through CJ_PYTHON_PREFIXES): must exit non-zero with the
#      reason counts, and env_check on that pool must say generation failed;
#   3. rl_async --set rl.tasks=coding on the fallback without the opt-in: must fail before
#      building anything, naming env.allow_unsandboxed_rewards.
# Writes benchmarks/results/env_fallback/ (run.txt: the commands and what they printed, without
# the repeated sandbox warnings and progress bars; plus the workdir files of step 1).
# Usage: bash benchmarks/env_fallback_acceptance.sh   (from the repository root; ~5 min on 2 CPUs)
set -u
PY=${PYTHON:-python}
OUT=benchmarks/results/env_fallback
TMP=$(mktemp -d /tmp/cj-fallback-acceptance-XXXXXX)
chmod 755 "$TMP"
rm -rf "$OUT" && mkdir -p "$OUT"
LOG="$OUT/run.txt"
clean() { tr '\r' '\n' | grep -v -e "^WARNING: composer_jax.env: " -e "RuntimeWarning: composer_jax.env: " -e "self.backend = " -e "^[IW][0-9]\{4\} " \
          -e "^env tasks:" -e "^env_check:" -e "^\s*$"; }
run() { echo "\$ $*" >> "$LOG"; "$@" 2>&1 | clean >> "$LOG"; echo "exit status: ${PIPESTATUS[0]}" >> "$LOG"; }

{ date -u; uptime; } >> "$LOG"
run $PY launch.py --experiment=env_generate --workdir=$OUT --set env.sandbox_backend=fallback \
    --set env.num_tasks=24 --set env.pool_dir=$TMP/pool
run $PY launch.py --experiment=env_check --workdir=$OUT --set env.sandbox_backend=fallback \
    --set env.pool_dir=$TMP/pool

NEWEST=$($PY -c "from composer_jax.env.pythons import find_pythons as f; \
print(max(f(), key=lambda v: tuple(map(int, v.split('.')))))")
$PY - "$TMP/broken" "$NEWEST" <<'EOF'
import os, pathlib, shutil, sys
from composer_jax.env.pythons import get_python
dst, v = sys.argv[1], sys.argv[2]
shutil.copytree(get_python(v).prefix, dst, symlinks=True,
                ignore=shutil.ignore_patterns("site-packages"), copy_function=os.link)
ut = pathlib.Path(dst, "lib", f"python{v}", "unittest")
for f in [ut / "__init__.py", *(ut / "__pycache__").glob("__init__.*")]:
    f.unlink()  # never write through a hard link into the real install
(ut / "__init__.py").write_text("raise ImportError('deliberately broken unittest')\n")
EOF
echo "# CJ_PYTHON_PREFIXES=<copy of CPython $NEWEST whose unittest raises ImportError>" >> "$LOG"
CJ_PYTHON_PREFIXES=$TMP/broken run $PY launch.py --experiment=env_generate --workdir=$TMP/bw \
    --set env.sandbox_backend=fallback --set env.python_versions=$NEWEST --set env.num_tasks=20 \
    --set env.package_sources=
run $PY launch.py --experiment=env_check --workdir=$TMP/bw --set env.sandbox_backend=fallback \
    --set env.python_versions=$NEWEST
run $PY launch.py --experiment=rl_async --workdir=$TMP/rl --set rl.tasks=coding \
    --set env.sandbox_backend=fallback
echo "rl_async workdir after the refusal: $(ls $TMP/rl)" >> "$LOG"
{ date -u; uptime; } >> "$LOG"
sed -i "s#$TMP#TMP#g" "$LOG"
rm -rf "$TMP"
