"""jaxfit: the largest batch and the smallest memory fraction of a JAX train step, from the compiler.

Public API::

    import jaxfit
    result = jaxfit.fit_batch(jaxfit.example_source("gpt-tiny"), jaxfit.FitOptions(mem_fraction=0.45))
    result.batch_size, result.peak_bytes, result.budget_bytes

Importing jaxfit does not initialise a JAX backend: compiles happen in a child process that sees
the target memory fraction.
"""

from jaxfit.fit.budget import format_bytes, parse_size
from jaxfit.errors import (
    CompileError,
    ConfigError,
    DoesNotFitError,
    JaxfitError,
    WorkerError,
    WorkloadError,
)
from jaxfit.fit import Candidate, FitOptions, FitResult, fit_batch, fit_fraction
from jaxfit.fit.memory import MemoryReport, analyse
from jaxfit.fit.search import Grid, SearchResult, doubling_bisection, search
from jaxfit.fit.sources import entry_source, example_source
from jaxfit.fit.workload import Workload, abstractify, from_state

__version__ = "0.2.0"

__all__ = [
    "Candidate", "CompileError", "ConfigError", "DoesNotFitError", "FitOptions", "FitResult", "Grid",
    "JaxfitError", "MemoryReport", "SearchResult", "WorkerError", "Workload", "WorkloadError",
    "abstractify", "analyse", "doubling_bisection", "entry_source", "example_source", "fit_batch",
    "fit_fraction", "format_bytes", "from_state", "parse_size", "search",
]
