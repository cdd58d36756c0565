"""Stage 2: SoftRankPO on an offline corpus (DESIGN §6).

Not built yet (issue: two-stage MPDF training). This script refuses to run rather than pretend to work.
"""
import sys

if __name__ == "__main__":
    sys.exit("train_rl.py is not built yet: see the open issue 'Two-stage MPDF training under torchrun'.")
