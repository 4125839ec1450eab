"""Measurement types: what one trial measured, what a study optimises, and how figures compare.
The bottom layer of spectune: every other part reads and writes these; nothing here starts an
engine, reads a file or talks to a database.
"""

from spectune.measurement._models import *  # noqa: F403
from spectune.measurement._models import __all__ as _models
from spectune.measurement._objective import *  # noqa: F403
from spectune.measurement._objective import __all__ as _objective

__all__ = [*_models, *_objective]
