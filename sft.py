"""Stage 1: supervised bootstrapping of the meta-policy (DESIGN §5).

Not built yet (issue: two-stage MPDF training). This script refuses to run rather than pretend to work.
"""
import sys

if __name__ == "__main__":
    sys.exit("sft.py is not built yet: see the open issue 'Two-stage MPDF training under torchrun'.")
