"""The simulation engine and the Method contract: client profiles, the round loop, ledger, history and checkpoints."""
from .aggregation import weighted_average
from .engine import EngineSettings, SimulationResult, run_simulation, select_clients
from .history import History, read_history
from .ledger import Ledger, tensor_bytes
from .method import ClientContext, Method, ServerContext, ServerState
from .profiles import Heterogeneity, parse_heterogeneity
from .rng import numpy_rng, torch_generator
from .training import ClientDataset, LocalTraining, evaluate, train_epochs
from .types import ClientProfile, Task, Update

__all__ = ["ClientContext", "ClientDataset", "Method", "ServerContext", "ServerState", "ClientProfile", "EngineSettings", "Heterogeneity", "History", "Ledger",
           "LocalTraining", "SimulationResult", "Task", "Update", "evaluate", "numpy_rng", "parse_heterogeneity",
           "read_history", "run_simulation", "select_clients", "tensor_bytes", "torch_generator", "train_epochs",
           "weighted_average"]
