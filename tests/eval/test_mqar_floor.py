"""The associative-recall floor (docs/evaluation.md §4.6): the accuracy a model reaches by answering
each query with one of its row's context values, with no key-to-value association. Scored on
hand-made rows and on hand-made answers: an oracle scores 100, the floor's model scores the floor,
a model answering another row's values scores about 0 and is rarely in the row."""

from __future__ import annotations

import torch

from fsframework.config import MqarConfig
from fsframework.data.mqar import RecallRows, recall_rows
from fsframework.eval.mqar import score_answers

SPEC = MqarConfig(pairs=8, queries=8, keys=64, values=64, filler=16)


def hand_made_rows() -> RecallRows:
    """Two rows of 13 tokens: row 0 has values [40, 40, 41] for keys 1, 2, 3 and asks keys 1 and 3;
    row 1 has values [50, 51, 52] for keys 4, 5, 6 and asks key 6 only."""
    f = 99
    tokens = torch.tensor([[1, 40, 2, 40, 3, 41, f, f, f, 1, 40, 3, 41, f],
                           [4, 50, f, 5, 51, 6, 52, f, f, 6, 52, f, f, f]])
    weights = torch.zeros(2, 13)
    weights[0, 9] = weights[0, 11] = weights[1, 9] = 1.0
    source = torch.full((2, 13), -1)
    source[0, 9], source[0, 11], source[1, 9] = 1, 5, 6
    return RecallRows(tokens, weights, source, torch.tensor([[40, 40, 41], [50, 51, 52]]))


def test_floor_and_in_row_on_hand_made_rows():
    rows = hand_made_rows()
    where = rows.weights > 0
    oracle = score_answers(rows, where, torch.tensor([40, 41, 52]), reach=4)
    # floors: key 1's answer 40 is 2 of row 0's 3 values, key 3's 41 is 1 of 3, key 6's 52 is 1 of 3
    assert abs(oracle["floor"] - 100 * (2 / 3 + 1 / 3 + 1 / 3) / 3) < 1e-9
    assert oracle["score"] == oracle["in_row"] == 100.0
    # distances 8, 6 and 3: reach 4 puts the last query within, the first two beyond
    assert (oracle["within_n"], oracle["beyond_n"]) == (1, 2)
    assert abs(oracle["beyond_floor"] - 50.0) < 1e-9 and abs(oracle["within_floor"] - 100 / 3) < 1e-9
    mixed = score_answers(rows, where, torch.tensor([41, 40, 60]), reach=4)
    assert mixed["score"] == 0.0 and abs(mixed["in_row"] - 200 / 3) < 1e-9 and mixed["within_in_row"] == 0.0


def test_the_floor_is_what_a_model_that_knows_only_the_rows_values_scores():
    rows = recall_rows(torch.Generator().manual_seed(0), SPEC, 600, 127)
    where = rows.weights > 0
    answers = rows.tokens[:, 1:][where]
    row = where.nonzero()[:, 0]
    oracle = score_answers(rows, where, answers, reach=32)
    assert oracle["score"] == oracle["in_row"] == 100.0
    expected_floor = 100 * (1 + (SPEC.pairs - 1) / SPEC.values) / SPEC.pairs  # 13.9: values drawn independently
    assert abs(oracle["floor"] - expected_floor) < 1.0

    gen = torch.Generator().manual_seed(1)
    pick = torch.randint(0, SPEC.pairs, (len(row),), generator=gen)
    guesser = score_answers(rows, where, rows.values[row, pick], reach=32)  # a random value of the row
    assert guesser["in_row"] == 100.0
    assert abs(guesser["score"] - oracle["floor"]) < 2.0  # 4,800 queries: one standard error is 0.5
    assert abs(guesser["beyond"] - guesser["beyond_floor"]) < 2.5

    other = score_answers(rows, where, rows.values[(row + 1) % 600, pick], reach=32)  # another row's value
    assert other["score"] < 3.0 and other["in_row"] < 20.0  # only where two rows drew the same ids
    assert other["floor"] == oracle["floor"]  # the floor belongs to the rows, not to the answers
