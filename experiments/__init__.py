"""The lab: the studies behind every reported number (results/), run as a package from the
repository's root, `python -m experiments.run PIECE`. They use the spine's shared modules
(solutions.py, deliberate.py, softrank.py, stats.py) and the library (llm/, data/, common.py), and
run a script (eval.py, train_rl.py, ...) as a command when they need what it does; nothing outside
the lab imports it."""
