"""Search strategies behind one ask-and-tell contract over the study's storage.

Any number of workers, on one machine or many, ask a :class:`SearchStrategy` for their next
trial; its answer is computed from what the storage holds (:class:`StudyStrategy`: baseline,
guided search or the grid or Optuna's sampler, rechecks, confirmations).
"""

from spectune.search._base import (
    Decision,
    Run,
    SearchStrategy,
    Snapshot,
    Stop,
    Wait,
    snapshots,
)
from spectune.search._inputs import measured_trials, predict_study, study_inputs
from spectune.search._study import (
    StudyStrategy,
    count_candidates,
    measured_again,
    params_key,
)

__all__ = [
    "Decision",
    "Run",
    "SearchStrategy",
    "Snapshot",
    "Stop",
    "StudyStrategy",
    "Wait",
    "count_candidates",
    "measured_again",
    "measured_trials",
    "params_key",
    "predict_study",
    "snapshots",
    "study_inputs",
]
