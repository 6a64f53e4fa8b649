"""Experiment configs, scale presets, behavioural provenance (run keys) and the runner used by the CLI."""
from .config import FIELDS, ExperimentConfig, make_config
from .presets import SCALES, default_scale, preset
from .provenance import canonical_config, environment_class, run_key, run_versions
from .runner import RunResult, final_table, history_frame, prepare_data, run_experiment, run_seeds

__all__ = ["FIELDS", "SCALES", "ExperimentConfig", "RunResult", "canonical_config", "default_scale",
           "environment_class", "final_table", "history_frame", "make_config", "prepare_data", "preset", "run_experiment",
           "run_key", "run_seeds", "run_versions"]
