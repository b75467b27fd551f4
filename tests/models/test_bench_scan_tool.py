"""`tools/bench_scan.py` runs end to end at toy lengths: every length timed with its page
faults, a growth exponent per model, and the allocator switch (docs/argrc.md §8)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.utils import REPO


@pytest.mark.parametrize("allocator", ["system", "reuse"])
def test_bench_scan_prints_times_faults_and_exponents(allocator):
    proc = subprocess.run([sys.executable, "tools/bench_scan.py", "--lengths", "64", "128", "256", "--models",
                           "argrc", "sinusoidal", "--width", "16", "--repeats", "1", "--allocator", allocator],
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"allocator {allocator}" in proc.stdout
    for model in ("argrc", "sinusoidal"):
        timed = re.findall(rf"^{model} .* N=\s*(\d+)\s+wall\s+[\d.]+ s\s+cpu\s+[\d.]+ s\s+page faults\s+\d+$",
                           proc.stdout, flags=re.M)
        assert timed == ["64", "128", "256"], proc.stdout
        fits = re.findall(rf"^{model} .*growth exponent of wall time: (-?[\d.]+) \(fit over 64..256\)", proc.stdout,
                          flags=re.M)
        assert len(fits) == 1, proc.stdout
