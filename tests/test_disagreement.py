"""The truth-free disagreement check between the two score families (``estimator="auto"``)."""

import warnings

import numpy as np
import pytest

from kelr_dist.kernels.response.blocking import BlockingResult
from kelr_dist.kernels.response.operator import ResponseResult
from kelr_dist.kernels.scores.heldout import Choice
from kelr_dist.kernels.scores.score_matching import Candidate
from kelr_dist.pipeline.warnings import DisagreementWarning, Entries, warn_disagreement


def result(mean: np.ndarray, stderr: float) -> ResponseResult:
    shape = mean.shape
    blocks = BlockingResult(
        mean=mean,
        stderr=np.full(shape, stderr),
        block_size=np.ones(shape),
        converged=np.ones(shape, dtype=bool),
        block_sizes=np.ones(1),
        n_blocks=np.ones((1, shape[0])),
    )
    return ResponseResult(blocks, kept=100, n=100, stein=blocks)


def table(ke_loss: float, sm_loss: float, ke_chosen: bool) -> list[Choice]:
    return [
        Choice("kernel-embedding", 12, np.nan, ke_loss, 0.1, ke_chosen),
        Choice("score-matching", 3, 1e-6, sm_loss + 1.0, 0.1, False),
        Choice("score-matching", 4, 1e-6, sm_loss, 0.1, not ke_chosen),
    ]


PICK = Candidate(4, 1e-6, 0.0, np.zeros(4))
K = np.linspace(1.0, 0.0, 11)[:, None, None] * np.ones((1, 2, 2))
NAMES = Entries(("x1", "x2:bin3"), ("x1", "x2"), dt=0.5, time_units="s")


@pytest.mark.parametrize("ke_chosen", [True, False])
def test_families_apart_by_many_stderr_with_tied_losses_warn(ke_chosen):
    rival = "score_matching" if ke_chosen else "kernel_embedding"
    responses = {"response": result(K, 0.01), f"response_{rival}": result(K + 0.1, 0.01)}
    # the entry is named as the result names it, its lag as a time in the data's unit
    message = r"differ by 7\.1 standard errors \(x1 forced on x1 at time 0 s\)"
    with pytest.warns(DisagreementWarning, match=message):
        z = warn_disagreement(responses, table(-2.0, -2.1, ke_chosen), PICK, NAMES)
    assert z == pytest.approx(0.1 / np.hypot(0.01, 0.01))


def test_a_decisive_loss_gap_or_agreeing_responses_stay_silent():
    responses = {"response": result(K, 0.01), "response_score_matching": result(K + 0.1, 0.01)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # losses 7 standard errors apart: the held-out choice is decisive
        assert warn_disagreement(responses, table(-3.0, -2.0, True), PICK, NAMES) > 5
        # responses within their error bars
        close = {"response": result(K, 0.01), "response_score_matching": result(K + 0.02, 0.01)}
        assert warn_disagreement(close, table(-2.0, -2.1, True), PICK, NAMES) < 5
        # one family only: nothing to compare
        alone = {"response": result(K, 0.01)}
        assert warn_disagreement(alone, table(-2, -2, True)[1:], PICK, NAMES) is None
        assert warn_disagreement(responses, table(-2.0, -2.1, True), None, NAMES) is None
