"""The simulator: functional (numpy) and timing (cycles per core and pipe) execution of PTO programs."""
from .machine import A2A3, MACHINES, TEACH, Machine, get_machine
from .result import SimResult
from .run import simulate

__all__ = ["A2A3", "MACHINES", "TEACH", "Machine", "SimResult", "get_machine", "simulate"]
