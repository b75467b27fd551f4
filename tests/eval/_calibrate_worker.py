"""One rank of `fsf calibrate` under torchrun-style environment variables (tests/eval/test_fsb_chain.py)."""

import sys

from fsframework.eval.calibrate import calibrate

if __name__ == "__main__":
    run, windows, seq_len, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    record = calibrate(run, windows=windows, seq_len=seq_len, seed=seed, progress=False)
    print("tau", record["tau"], "cells", record["cells"])
