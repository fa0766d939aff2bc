"""The simulator: functional (numpy) and timing (cycles per core and pipe) execution of PTO programs."""
from .cost import cost, instruction_table
from ..target.machine import A2A3, A5, MACHINES, TEACH, Machine, get_machine, load_machine
from .result import SimResult
from .run import simulate

__all__ = ["A2A3", "A5", "MACHINES", "TEACH", "Machine", "SimResult", "cost", "get_machine", "instruction_table",
           "load_machine", "simulate"]
