"""jaxfit: the largest batch and the smallest memory fraction of a JAX train step, from the compiler.

Public API::

    import jaxfit

    result = jaxfit.fit_batch(jaxfit.example_source("gpt-tiny"), jaxfit.FitOptions(mem_fraction=0.45))
    result.batch_size, result.peak_bytes, result.budget_bytes, result.run_env()

    def make_workload() -> jaxfit.Workload:  # your own step
        return jaxfit.from_state("my-model", train_step, abstract_state, batch_spec)

    jaxfit.fit_fraction(jaxfit.entry_source("my_module:make_workload"), batch_size=64)
    jaxfit.fit_batch(jaxfit.script_source(["python", "train.py", "--exp-name=x"]))
    jaxfit.fit_batch(jaxfit.example_source("gpt-small", mesh=jaxfit.MeshSpec(devices=4, fsdp=2)))

Importing jaxfit does not initialise a JAX backend: compiles happen in a child process that sees
the target memory fraction. The stages live in :mod:`jaxfit.fit` (the compiler's answer),
:mod:`jaxfit.run` (running a training command with it) and :mod:`jaxfit.schedule` (several runs
on shared GPUs); their internals stay importable from their modules.
"""

from jaxfit.errors import (
    CompileError,
    ConfigError,
    DoesNotFitError,
    ErraticCurveError,
    JaxfitError,
    WorkerError,
    WorkloadError,
)
from jaxfit.fit import Candidate, FitOptions, FitResult, fit_batch, fit_fraction
from jaxfit.fit.budget import format_bytes, parse_size
from jaxfit.fit.memory import MemoryReport
from jaxfit.fit.mesh import MeshSpec
from jaxfit.fit.sources import (
    EntrySource,
    ExampleSource,
    ScriptSource,
    Source,
    entry_source,
    example_source,
    script_source,
)
from jaxfit.fit.workload import Workload, abstractify, from_state
from jaxfit.versions import jaxfit_version

__version__ = jaxfit_version()

__all__ = [
    "Candidate",
    "CompileError",
    "ConfigError",
    "DoesNotFitError",
    "EntrySource",
    "ErraticCurveError",
    "ExampleSource",
    "FitOptions",
    "FitResult",
    "JaxfitError",
    "MemoryReport",
    "MeshSpec",
    "ScriptSource",
    "Source",
    "WorkerError",
    "Workload",
    "WorkloadError",
    "__version__",
    "abstractify",
    "entry_source",
    "example_source",
    "fit_batch",
    "fit_fraction",
    "format_bytes",
    "from_state",
    "parse_size",
    "script_source",
]
