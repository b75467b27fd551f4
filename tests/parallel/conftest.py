"""The one-rank baseline the data-parallel tests of this folder compare with (tests.parallel.cli_runs)."""

from tests.parallel.cli_runs import one_rank_two_micro_batches  # noqa: F401  (a fixture)
