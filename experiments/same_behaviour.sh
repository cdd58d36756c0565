#!/usr/bin/env bash
# Behaviour check for refactors: a tiny-budget sft.py -> train_rl.py run (fixed seed, plain python and a
# 2-process torchrun), an eval.py table on 16 questions, one MAGRPO step (train_magrpo.py), one MLPO
# step (train_mlpo.py) and one supervised epoch of an agent on worked solutions (train_solver.py),
# each with its own cold generation cache. A checkout from before those three scripts runs the same
# through train_llm.py --target agents | leader | sft.
# Run it on a checkout before and after a change, then compare:
#   git worktree add /tmp/before HEAD~1 && bash experiments/same_behaviour.sh /tmp/before /tmp/check-before
#   bash experiments/same_behaviour.sh . /tmp/check-after
#   .venv/bin/python -m experiments.same_behaviour /tmp/check-before /tmp/check-after
# About 10 minutes on 2 CPU cores with the default backbone.
set -euo pipefail
REPO=$(cd "$1" && pwd); OUT=$2
PY=${PY:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
rm -rf "$OUT"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
GAME="--questions 8 --val-n 4 --agents 3 --rounds 2 --max-new-tokens 48 --seed 3"
cd "$REPO"
for mode in py tr; do
  if [ $mode = py ]; then LAUNCH="$PY"; else LAUNCH="$PY -m torch.distributed.run --nproc_per_node=2"; fi
  $LAUNCH sft.py $GAME --epochs 3 --batch-size 16 --out-dir "$OUT/sft-$mode" --cache-dir "$OUT/cache-$mode" \
    > "$OUT/sft-$mode.log" 2>&1
  $LAUNCH train_rl.py $GAME --epochs 3 --batch-size 16 --lam 0.05 --init "$OUT/sft-$mode/policy.safetensors" \
    --out-dir "$OUT/rl-$mode" --cache-dir "$OUT/cache-$mode" > "$OUT/rl-$mode.log" 2>&1
done
$PY eval.py --task arith --split test --n 16 --seed 0 --agents 3 --rounds 2 --max-new-tokens 64 \
  --protocols "vanilla,sc,debate,mpdf-persist,mpdf-oracle,mpdf=$OUT/sft-py/policy.safetensors,mpdf=$OUT/rl-py/policy.safetensors" \
  --cache-dir "$OUT/cache-eval" > "$OUT/eval.out" 2> "$OUT/eval.err"
if [ -f train_llm.py ]; then
  MAGRPO="train_llm.py --target agents"; MLPO="train_llm.py --target leader"
  SOLVER="train_llm.py --target sft"
else
  MAGRPO=train_magrpo.py; MLPO=train_mlpo.py; SOLVER=train_solver.py
fi
# agents that answer in the format (the committed rank-4 worked-solution adapter, the demo's) at
# the budget they were trained at, with the format reward: groups that are not flat, so each step
# has a gradient (the bare backbone's answers earn nothing and every group is flat)
LLM="--agents 2 --group 4 --questions-per-step 2 --steps 1 --val-n 0"
LLM="$LLM --max-new-tokens 96 --seed 3 --format-reward 0.5"
LLM="$LLM --init-adapter results/agents/worked-L1-r4-seed0"
# MAGRPO samples from the weights it trains, uncached; MLPO's frozen peers use the cache
$PY $MAGRPO $LLM --rounds 1 --out-dir "$OUT/magrpo" > "$OUT/magrpo.log" 2>&1
$PY $MLPO --questions 8 --filter-easy 0 $LLM --cache-dir "$OUT/cache-llm" --out-dir "$OUT/mlpo" \
  > "$OUT/mlpo.log" 2>&1
# validated greedily before and after its one step (at this rate the answers change)
$PY $SOLVER --questions 8 --val-n 16 --epochs 1 --batch-size 8 --micro-batch 4 --max-new-tokens 64 \
  --seed 1 --eval-every 1 --lr 1e-3 --cache-dir "$OUT/cache-solver" --out-dir "$OUT/solver" \
  > "$OUT/solver.log" 2>&1
echo "done: $OUT"
