"""Search spaces: which speculative-decoding configurations a study may try.

A space is read from YAML (``search_spaces/*.yaml`` or a user's file) straight into
:class:`SearchSpace`; every mistake is one :class:`~spectune.errors.ConfigError` line naming the
file and the dotted key::

    description: n-gram lookup against no speculation
    methods:
      none: {}                              # the baseline: the target alone
      ngram:
        num_speculative_tokens: {low: 1, high: 6}
        prompt_lookup_max: [2, 3, 4, 5]
        prompt_lookup_min: {low: 1, high: 2}
      draft_model:
        models: ["${draft}"]
        num_speculative_tokens: 4           # one value: fixed, not tuned
    engine:                                 # fixed engine arguments (EngineArgs without `model`)
      max_num_seqs: 64

Parameter domains (:class:`IntDomain`, :class:`FloatDomain`):

- a scalar is one fixed value; a list is explicit choices; ``{low, high}`` is an inclusive range
  with an optional ``step`` (and, for float parameters, ``log: true``);
- an empty list, a repeated choice, ``low > high`` or a ``high`` off the ``step`` grid is an error,
  and so is a value that vLLM would refuse (``num_speculative_tokens: 0``).

Methods are the installed vLLM's (:func:`~spectune.config.engine_method_error`). Which of
spectune's parameters a method takes is fixed per method (``PARAMS``; a method spectune knows
nothing special about takes a head's, ``ngram_gpu`` n-gram's); a parameter of another method is
an error naming the method and the key. Any other field of vLLM's SpeculativeConfig may be given
as one value or a list of choices (:class:`MethodSpace`). ``requires: [module, ...]`` drops a
method whose Python modules are not importable here (suffix decoding needs
``arctic_inference``), with a logged warning. Whether the engine can run a method is the
study's question (:func:`spectune.engines.method_refusal`), asked before any engine starts.

Placeholders in ``models`` entries, substituted by :meth:`SearchSpace.resolve`:

- ``${target}``: the target model itself (as its own draft, say);
- ``${draft}``: the draft or head the user names for this study; several drafts make one entry
  each (a study keeps each under the method it serves, :func:`route_drafts`, and adds the heads
  built beside its target, :func:`local_heads`); with none, the entry is left out, and a method whose models all need a draft is dropped
  (logged at INFO);
- ``${env:VAR}``: the environment variable ``VAR``; unset is an error.

Optuna parameters (define-by-run, :meth:`SearchSpace.suggest`): ``method`` is a categorical over
the method names (strings), then each tuned parameter of the chosen method is named
``"{method}.{field}"`` with ``field`` the :class:`~spectune.config.SpecConfig` field
(``ngram.num_speculative_tokens``, ``draft_model.model``), so the dashboard shows them per method.
A fixed value (one value, including a one-method space's ``method``) is no Optuna parameter but
still goes into the :class:`~spectune.config.SpecConfig`.

n-gram windows keep ``prompt_lookup_min <= prompt_lookup_max``: when some combination of the two
domains would break it, one of them must be an integer range, and that one gets a *dynamic*
range (Optuna allows dynamic int/float ranges, not dynamic categorical choices). With
``prompt_lookup_min`` a range: ``max`` is suggested first (its values below the smallest ``min``
left out), then ``min`` in ``[low, min(high, max)]``. Otherwise ``max`` is the range: ``min`` first
(its values above the largest ``max`` left out), then ``max`` in ``[max(low, min), high]``.
Samplers that model parameters independently (TPE, random) handle such ranges; the grid sampler
does not, use :meth:`SearchSpace.enumerate` with ``study.enqueue_trial`` instead.
"""


from spectune.space._domains import Domain, FloatDomain, IntDomain, range_text
from spectune.space._drafts import draft_method, local_heads, route_drafts
from spectune.space._load import (
    SHIPPED_SPACES,
    SPACES_ENV,
    list_spaces,
    load_space,
    spaces_dirs,
)
from spectune.space._methods import FixedEngineArgs, MethodSpace
from spectune.space._space import KNOB_PREFIX, SearchSpace

__all__ = [
    "range_text",
    "KNOB_PREFIX",
    "SHIPPED_SPACES",
    "SPACES_ENV",
    "Domain",
    "FixedEngineArgs",
    "FloatDomain",
    "IntDomain",
    "MethodSpace",
    "SearchSpace",
    "draft_method",
    "list_spaces",
    "load_space",
    "local_heads",
    "route_drafts",
    "spaces_dirs",
]
