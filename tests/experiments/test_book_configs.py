"""Every configuration the book builds passes the config validation (issue 40): the catalog's and the notebooks'
configurations at the ``ci`` and ``cpu`` scales (``tests/experiments/book_configs.py``), and every configuration
recorded in the run store and in the executed pages. The validation neither refuses nor warns about any of them, and
leaves each one's run key as it was (it changes no field of a valid configuration)."""
from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from subfl.experiments import ExperimentConfig, run_key
from subfl.experiments.config import ignored_settings, validate_config

from .book_configs import book_configs, recorded_configs


def _check(label: str, config: ExperimentConfig) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_config(config)
        again = ExperimentConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        from_json = ExperimentConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert run_key(again) == run_key(config) == run_key(from_json), label
    assert not ignored_settings(config), label  # `subfl run` accepts it too


@pytest.mark.parametrize("scale", ["ci", "cpu"])
def test_every_book_configuration_validates(scale):
    configs = list(book_configs(scale))
    assert len(configs) > 900
    for label, config in configs:
        _check(f"{scale}: {label}", config)


def test_every_recorded_configuration_validates():
    for label, values in recorded_configs():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config = ExperimentConfig.from_dict(values)
        _check(label, config)
