"""The non-finite scan: the same count and first positions for any split into blocks."""

import numpy as np
import pytest

from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.survey.scan import nonfinite_reduction


@pytest.mark.parametrize("chunks", [None, 7, 33, [50, 1, 49]])
def test_count_and_first_positions_do_not_depend_on_the_blocks(chunks):
    x = np.zeros((2, 100, 3), dtype=np.float32)
    x[1, 5, 2], x[0, 90, 0], x[1, 99, 1], x[0, 91, 2] = np.nan, np.inf, -np.inf, np.nan
    result = reduce_in_memory(nonfinite_reduction(first=3), x, chunks)
    assert result.count == 4
    np.testing.assert_array_equal(result.by_component, [1, 1, 2])
    np.testing.assert_array_equal(result.positions, [[0, 90, 0], [0, 91, 2], [1, 5, 2]])
    assert result.values[0] == np.inf and np.isnan(result.values[1:]).all()


def test_finite_data_have_no_positions():
    result = reduce_in_memory(nonfinite_reduction(), np.ones((10, 2)), 4)
    assert result.count == 0 and result.positions.shape == (0, 3)
