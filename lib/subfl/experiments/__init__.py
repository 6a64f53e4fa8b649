"""Named experiments, scale presets, the result cache and the runner used by the CLI and notebooks."""
from .cache import cache_root, code_fingerprint
from .config import FIELDS, ExperimentConfig, make_config
from .presets import SCALES, default_scale, preset
from .runner import RunResult, final_table, history_frame, prepare_data, run_experiment, run_seeds

__all__ = ["FIELDS", "SCALES", "ExperimentConfig", "RunResult", "cache_root", "code_fingerprint", "default_scale", "final_table", "history_frame",
           "make_config", "prepare_data", "preset", "run_experiment", "run_seeds"]
