#!/usr/bin/env bash
# The main comparison (issue 4): stage 1, then stage 2 with PPO, GRPO and SoftRankPO on the same corpus
# (the generations are cached, so the three corpora are the same games), then every protocol on N test
# questions per seed, mean ± std over SEEDS.
#
#   bash experiments/mpdf_table.sh                                    # arith, 300 questions, seeds 0,1,2
#   N=100 SEEDS=0 Q=64 VAL=16 OUT=runs/small bash experiments/mpdf_table.sh   # smaller budgets
#   TASK=mawps DATA=../shared/data/mawps_asdiv/train.csv EVAL_ONLY=runs/exp bash experiments/mpdf_table.sh
#       (EVAL_ONLY: evaluate the policies trained under that folder on TASK, e.g. the arith-trained ones)
#   TASK=mawps DATA=../shared/data/mawps_asdiv/train.csv OUT=runs/exp-mawps bash experiments/mpdf_table.sh
#       (trained on the file's train part, evaluated on its test part: data.split_of keeps them disjoint)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TASK=${TASK:-arith}; DATA=${DATA:-}; N=${N:-300}; SEEDS=${SEEDS:-0,1,2}; Q=${Q:-128}; OUT=${OUT:-runs/exp}
AGENTS=${AGENTS:-3}; ROUNDS=${ROUNDS:-3}; VAL=${VAL:-64}
GAME="--task $TASK --agents $AGENTS --rounds $ROUNDS ${DATA:+--path $DATA}"
POLICIES=${EVAL_ONLY:-$OUT}
if [ -z "${EVAL_ONLY:-}" ]; then
  $PY sft.py $GAME --questions "$Q" --val-n "$VAL" --out-dir "$OUT/sft"
  for algo in ppo grpo softrank; do
    $PY train_rl.py $GAME --questions "$Q" --val-n "$VAL" --init "$OUT/sft/policy.pt" --algo $algo --out-dir "$OUT/$algo"
  done
fi
PROTOCOLS="vanilla,cot,sc,debate,mpdf=$POLICIES/sft/policy.pt,mpdf=$POLICIES/ppo/policy.pt"
PROTOCOLS="$PROTOCOLS,mpdf=$POLICIES/grpo/policy.pt,mpdf=$POLICIES/softrank/policy.pt"
mkdir -p "$OUT"
$PY eval.py $GAME --split test --n "$N" --seeds "$SEEDS" --protocols "$PROTOCOLS" --out "$OUT/table-$TASK.json"
