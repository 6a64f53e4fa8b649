"""Costs of training a model on a client: parameters, FLOPs, memory and communication.

All functions are pure: they measure without changing the model (modes, buffers and ``.grad`` are
restored / untouched) or the global random state.
"""
from .communication import DIRECTIONS, LEDGER_COLUMNS, bytes_of, download_bytes, ledger_totals, upload_bytes
from .flops import default_loss, forward_flops, isolated_training_step, macs, training_flops
from .memory import (
    OPTIMIZER_STATE_MULTIPLIERS,
    SavedTensor,
    activation_memory_bytes,
    optimizer_state_bytes,
    saved_tensor_breakdown,
    training_memory,
)
from .params import buffer_bytes, count_parameters, parameter_bytes

__all__ = [
    "DIRECTIONS",
    "LEDGER_COLUMNS",
    "OPTIMIZER_STATE_MULTIPLIERS",
    "SavedTensor",
    "activation_memory_bytes",
    "buffer_bytes",
    "bytes_of",
    "count_parameters",
    "default_loss",
    "download_bytes",
    "forward_flops",
    "isolated_training_step",
    "ledger_totals",
    "macs",
    "optimizer_state_bytes",
    "parameter_bytes",
    "saved_tensor_breakdown",
    "training_flops",
    "training_memory",
    "upload_bytes",
]
