"""``StepLog``: each row's slice holds its own steps' values, whichever rows step together, at
whichever counts (against a list per row), and per-step numbers as float32."""

import numpy as np

from klppo.rl.engine.steplog import StepLog


def test_each_row_reads_its_own_steps_whatever_rows_step_together():
    R, S, n = 5, 6, 3
    log, ref = StepLog(R, S, n), {r: ([], []) for r in range(R)}
    rng = np.random.default_rng(0)
    # all rows; a contiguous subset; a non-contiguous one; rows at different counts
    for rows in ([0, 1, 2, 3, 4], [1, 2], [0, 3, 4], [0, 1, 2, 3, 4], [2], [4, 0], [1, 3]):
        rows = np.array(rows)
        x = rng.standard_normal((len(rows), n))  # float64, kept as it is
        g = rng.standard_normal(len(rows)).tolist()  # per-step floats: float32
        at = log.at(rows)
        log.put(at, "x", x)
        log.put(at, "g", g)
        half = log.part(at, slice(0, 1))  # the first row alone, through part()
        log.put(half, "y", x[:1])
        for a, r in enumerate(rows.tolist()):
            ref[r][0].append(x[a])
            ref[r][1].append(g[a])
        log.advance(rows)
    assert log.arrays["x"].dtype == np.float64 and log.arrays["g"].dtype == np.float32
    for r in range(R):
        steps = len(ref[r][0])
        got = log.rows(np.array([r]), ("x", "g"), steps)
        assert np.array_equal(got["x"][0], np.concatenate(ref[r][0]))
        assert np.array_equal(got["g"][0], np.array(ref[r][1], np.float32))
        assert log.steps[r] == steps


def test_part_narrows_slices_and_arrays_alike():
    log = StepLog(6, 2, 1)
    whole = log.at(np.arange(6))
    assert whole == (slice(0, 6), 0)
    assert log.part(whole, slice(2, 4)) == (slice(2, 4), 0)
    rows, k = log.part(whole, np.array([1, 5]))
    assert rows.tolist() == [1, 5] and k == 0
    log.advance(np.array([2]))
    rows, k = log.at(np.array([1, 2, 3]))
    assert rows.tolist() == [1, 2, 3] and k.tolist() == [0, 1, 0]
    rows, k = log.part((rows, k), np.array([1]))
    assert rows.tolist() == [2] and k.tolist() == [1]
