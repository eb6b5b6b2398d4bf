"""``jaxfit tune``: the fastest settings that fit, proven by compiling and measured by running.

:mod:`jaxfit.tune.space` (settings and micro-batches, pure logic), :mod:`jaxfit.tune.engine`
(the tune: prune, measure, rank), :mod:`jaxfit.tune.model` (options, rows, result, target),
:mod:`jaxfit.tune.prove` (each setting's search and the proofs of its micro-batches),
:mod:`jaxfit.tune.ranking` (proofs ranked on untuned programs, pure logic),
:mod:`jaxfit.tune.measure` (fresh-process and inline measurements), :mod:`jaxfit.tune.peaks` (peak FLOP/s for MFU),
:mod:`jaxfit.tune.trial` (the training process of a built-in example), :mod:`jaxfit.tune.report`.
"""

from jaxfit.tune.engine import Row, Target, TuneOptions, TuneResult, tune
from jaxfit.tune.space import Setting, example_settings, script_settings

__all__ = ["Row", "Setting", "Target", "TuneOptions", "TuneResult", "example_settings", "script_settings", "tune"]
