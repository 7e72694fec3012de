"""The experiment runner (`opct run`): arms x seeds of pairs -> train -> evaluate, then the report."""

from opct.experiment.config import ExperimentConfig, load_experiment
from opct.experiment.runner import run_experiment

__all__ = ["ExperimentConfig", "load_experiment", "run_experiment"]
