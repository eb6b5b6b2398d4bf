"""The ``jaxfit`` command line: one module per subcommand, a thin tyro layer over the Python API.

``jaxfit fit`` (:mod:`jaxfit.cli.fit`), ``version`` (:mod:`jaxfit.cli.version`), ``run`` (:mod:`jaxfit.cli.run`), ``schedule`` and
``calibrate`` (:mod:`jaxfit.cli.schedule`), ``tune`` (:mod:`jaxfit.cli.tune`), ``plan``
(:mod:`jaxfit.cli.plan`), ``examples``
(:mod:`jaxfit.cli.examples`); the app,
the options they share and the one-line error handling are in :mod:`jaxfit.cli.app`; tables and
progress lines for people in :mod:`jaxfit.cli.output`.
"""

from jaxfit.cli import examples, fit, gpus, plan, run, schedule, tune, version  # noqa: F401 - each registers its subcommand
from jaxfit.cli.app import main

__all__ = ["main"]
