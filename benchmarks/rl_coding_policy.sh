#!/usr/bin/env bash
# The level-1 coding policy of issue 41 from nothing, one stage after another; a stage whose output
# exists is skipped, so the script resumes after a stop (an interrupted SFT run resumes from its own
# checkpoint). Results and what each stage measured: benchmarks/results/rl_coding_ladder.txt,
# sections 14-26. Usage (repository root):
#   bash benchmarks/rl_coding_policy.sh [RUNS_DIR]     (default runs; PYTHON=... picks the interpreter)
# Stages and their time alone on 2 CPU cores (upper bounds, measured beside other jobs):
#   pool       level-1 tasks, 400 training + 64 held-out, sandbox-verified            ~20 min
#   tokenizer  the cpt_small byte-level BPE (4096 ids) of the local code corpus        ~10 min
#   copy       a 2-layer tiny model with a 64-dim KV latent learns to copy: the vocabulary
#              curriculum, then longer sources (copy_formation_kv64.txt)               ~25 min
#   recall     grown to 3 layers (layer 0 copied, x 0.1), recall rows: a lookup by key
#              (recall_formation_3layers.txt)                                          ~15 min
#   grow       a fresh 4th layer inserted after layer 2 (x 0.1)                          seconds
#   sft        the oracle demonstrations of training tasks (careful, hasty, renamed) beside edit
#              tails (the edit turn after only the last traceback frame it copies from), then
#              tails alone; recall rows, value-start tokens weighted          ~1.3 s/step alone
set -euo pipefail
R=${1:-runs}
PY=${PYTHON:-python}
mkdir -p "$R"
log() { echo "[$(date +%H:%M:%S)] $*"; }

log "pool (tops up to the counts; a complete pool is kept as it is)"
$PY launch.py --experiment=env_ladder --workdir="$R/ladder1" --set rl.task.levels=1 \
  --set rl.task.ladder_train=400 --set rl.task.ladder_heldout=64
if [ ! -e "$R/tcode2/tokenizer.json" ]; then
  log "tokenizer"
  mkdir -p "$R/tcode2"
  $PY - "$R/tcode2" <<'PYEOF'
import sys
from composer_jax import data
from experiments.pretrain import _small
cfg = _small()      # the cpt_small data config: the whole local corpus, 4096 ids
tok = data.build_or_load_tokenizer(cfg.data, data.build_or_load_corpus(cfg.data), cfg.model.vocab_size)
print(tok.save(sys.argv[1]))
PYEOF
fi
if [ ! -e "$R/cpD1_hf" ]; then
  log "copy: vocabulary curriculum"
  $PY benchmarks/copy_formation.py --vocab 4096 --length 32 --model first_k_dense=2 --model kv_lora_rank=64 \
    --restrict_softmax --stages 64:1000,128:500,256:500,512:500,1024:500,2048:500,4096:1000 --save "$R/cpD1_hf"
fi
if [ ! -e "$R/cpD1L_hf" ]; then
  log "copy: longer sources"
  $PY benchmarks/copy_formation.py --vocab 4096 --init "$R/cpD1_hf" --stages 4096:500:64,4096:500:128 \
    --save "$R/cpD1L_hf"
fi
[ -e "$R/cpD1L3_hf" ] || $PY -m composer_jax.model.depth_growth "$R/cpD1L_hf" "$R/cpD1L3_hf" --at 0 --scale 0.1
if [ ! -e "$R/rcG1_hf" ]; then
  log "recall: 64 ids"
  $PY benchmarks/copy_formation.py --vocab 4096 --copy recall --recall_suffix 0 --restrict_softmax \
    --init "$R/cpD1L3_hf" --stages 64:2000:32 --save "$R/rcG1_hf"
fi
if [ ! -e "$R/rcG3_hf" ]; then
  log "recall: the whole vocabulary"
  $PY benchmarks/copy_formation.py --vocab 4096 --copy recall --recall_suffix 0 --restrict_softmax \
    --init "$R/rcG1_hf" --stages 256:500:32,1024:500:64,4096:1000:64 --save "$R/rcG3_hf"
fi
[ -e "$R/rcG3F_hf" ] || $PY -m composer_jax.model.depth_growth "$R/rcG3_hf" "$R/rcG3F_hf" --at 2 --scale 0.1 --fresh_seed 0
# sft NAME INIT STEPS WINDOWS RENAMES WINDOW_RENAMES [WINDOW_CONTEXT]: one SFT run (a finished one is a no-op, a
# stopped one resumes)
sft() {
  log "sft $1 (from $2, $3 steps, $4)"
  $PY launch.py --experiment=sft --workdir="$R/$1" --set model=tiny --set model.vocab_size=4096 \
    --set model.num_layers=4 --set model.first_k_dense=4 --set model.kv_lora_rank=64 --set model.mtp_depth=0 \
    --set data.vocab_size=4096 --set data.tokenizer_path="$R/tcode2/tokenizer.json" \
    --set train.init_from="$2" --set data.sft_pool="$R/ladder1/pool" --set env.pool_dir="$R/ladder1/pool" \
    --set env.declare_tools=false --set data.sft_hasty=0.25 --set data.sft_renames="$5" \
    --set data.sft_turn_windows="$4" --set data.sft_window_renames="$6" --set data.sft_window_context="${7:-0}" \
    --set data.sft_value_weight=5 --set data.copy_rows=0.25 --set data.copy_source=recall \
    --set data.copy_source_tokens=128 --set data.seq_len=1280 --set data.global_batch_size=4 \
    --set train.steps="$3" --set train.lr=2e-3 --set train.min_lr_ratio=0.0 --set train.warmup_steps=10 \
    --set train.eval_every=100000 --set train.eval_batches=2 --set train.log_every=20 \
    --set train.checkpoint_every=250 --set train.keep_checkpoints=20 --set env.use_embeddings=false \
    --set data.build_workers=2
}
# The runs of sections 24-25, each with the cosine horizon it ran under; the next starts from the checkpoint that was
# scored (its run was stopped there by hand: running a stage to the end only costs time, the checkpoint is the same).
# Stages 1-4 ran on PLAN_VERSION 4 demonstrations (the suite's last 12 lines), stage 5 on version 5 (its first error
# and the 3 lines above); rerun today, every stage trains on version 5 (the SFT store is keyed by the plan).
# 1. the protocol, with tails at 39% of the tokens: no lookup by step 2000
sft tsft_l1 "$R/rcG3F_hf" 2400 episodes_and_edit_tails 8 32
# 2. tails at 64% of the tokens: no lookup at step 500
sft tsft_l1b "$R/tsft_l1@1500" 1200 episodes_and_edit_tails 2 32
# 3. tails alone: the file-name lookup by step 750 (15 of 16 held-out tails), 16 of 16 at 1200; the protocol is
#    forgotten meanwhile
sft tsft_l1c "$R/tsft_l1b@500" 1200 edit_tails 32 0
# 4. whole demonstrations beside tails again: the protocol back (0.996) and old_string 11 of 16 in whole episodes,
#    but the file 0 of 16 there; stopped at 686
sft tsft_l1d "$R/tsft_l1c@1200" 800 episodes_and_edit_tails 8 32
# 5. PLAN_VERSION 5 demonstrations (section 25): old_string 13 of 14 and new_string 8 of 14 in whole episodes at step
#    500, the file still 0 of 14 (15 of 15 in tails); stopped at 500
sft tsft_l1e "$R/tsft_l1d@500" 600 episodes_and_edit_tails 8 32
# 6. windows also after the task statement and the first call (data.sft_window_context=2): the file lookup works
#    there, but not after the system prompt; stopped at 353
sft tsft_l1f "$R/tsft_l1e@500" 600 episodes_and_edit_tails 8 16 2
# 7. windows up to the system prompt (data.sft_window_context=3): the file 11 of 16 in whole held-out episodes
sft tsft_l1g "$R/tsft_l1f@250" 400 episodes_and_edit_tails 8 16 3
# 8. more of stage 7 (section 26): the policy of the RL seeds (rl.task.init_from=$R/tsft_l1h)
sft tsft_l1h "$R/tsft_l1g@400" 800 episodes_and_edit_tails 8 16 3
log "done: $R/tsft_l1h"
