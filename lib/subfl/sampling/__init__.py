"""Inclusion probabilities and fixed-size without-replacement samplers for spectral sub-models.

* :mod:`subfl.sampling.inclusion` -- marginals ``pi`` of the spectral-sharding estimators (Unbiased,
  Collective, Schatten-p), PriSM's sampling distribution and its Wallenius marginals, and the expected
  Frobenius discrepancy; the softmax-based distribution of PriSM's sampling ablation.
* :mod:`subfl.sampling.samplers` -- exact designs with prescribed marginals: conditional Poisson (maximum
  entropy), Brewer, minimum support, and numpy's sequential ``choice`` used by PriSM.
"""
from .inclusion import (
    collective_inclusion,
    collective_term_discrepancy,
    collective_weights,
    expected_discrepancy,
    keep_count,
    monte_carlo_discrepancy,
    prism_probabilities,
    schatten_discrepancy,
    schatten_inclusion,
    softmax_probabilities,
    unbiased_inclusion,
    unbiased_weights,
    wallenius_inclusion,
)
from .samplers import (
    CPSDesign,
    cps_design,
    sample_brewer,
    sample_cps,
    sample_min_support,
    sample_numpy_choice,
)

__all__ = [
    "CPSDesign",
    "collective_inclusion",
    "collective_term_discrepancy",
    "collective_weights",
    "cps_design",
    "expected_discrepancy",
    "keep_count",
    "monte_carlo_discrepancy",
    "prism_probabilities",
    "sample_brewer",
    "sample_cps",
    "sample_min_support",
    "sample_numpy_choice",
    "schatten_discrepancy",
    "schatten_inclusion",
    "softmax_probabilities",
    "unbiased_inclusion",
    "unbiased_weights",
    "wallenius_inclusion",
]
