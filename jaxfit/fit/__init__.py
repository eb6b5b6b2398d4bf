"""The core: what a step needs, from the compiler.

``workload -> compile under a limit -> memory report -> search -> answer (and its pinned program)``:

- :mod:`jaxfit.fit.workload`, :mod:`jaxfit.fit.sources`: what is compiled (a step and its abstract
  arguments; a built-in example, a user's factory or a training script);
- :mod:`jaxfit.fit.compiler` (the parent's side) and :mod:`jaxfit.fit.worker`,
  :mod:`jaxfit._probe` (the child's): compiling in a process that sees the target limit;
- :mod:`jaxfit.fit.memory`, :mod:`jaxfit.fit.budget`, :mod:`jaxfit.fit.devices`: what a compile
  says, what a fraction gives, which devices there are;
- :mod:`jaxfit.fit.search`: which batches to compile (pure logic);
- :mod:`jaxfit.fit.batch`, :mod:`jaxfit.fit.fraction`: the two fits, with
  :mod:`jaxfit.fit.options` and :mod:`jaxfit.fit.results`;
- :mod:`jaxfit.fit.cache`, :mod:`jaxfit.fit.answers`: compiles and answers kept in SQLite;
- :mod:`jaxfit.fit.pin`: the proven program, for the training process;
  :mod:`jaxfit.fit.leftovers`: what a probe's start-up leaves.
"""

from jaxfit.fit.batch import fit_batch
from jaxfit.fit.fraction import fit_fraction
from jaxfit.fit.options import FitOptions
from jaxfit.fit.results import Candidate, FitResult

__all__ = ["Candidate", "FitOptions", "FitResult", "fit_batch", "fit_fraction"]
