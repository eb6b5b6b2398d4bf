#!/usr/bin/env python3
"""One of the two searches of ``jaxfit fit --gpu/--gpu-spec``, so the two can run at once.

    python3 benchmarks/openpi/deviceless_half.py squeezed|safe [jaxfit fit options] --gpu-spec CARD -- COMMAND

``jaxfit fit --gpu-spec`` (``jaxfit.fit.estimate.fit_for_gpu``) runs two searches one after the other,
each with its own start of the script: the **squeezed** one (the compiler sees the card's limit) and
then the **safe** one (the plain program within the budget less a 5 % margin, searched up to the
squeezed answer). A real-size openpi start-up on the CPU (random init of a 3.3B-parameter model) makes
that two long start-ups in a row. This runs ``python3 -m jaxfit.cli fit ...`` unchanged except that
``fit_for_gpu`` does only the named search, with the same options ``fit_for_gpu`` gives it:

- ``squeezed``: ``squeeze=True``, never pinned;
- ``safe``: ``squeeze=False`` and ``--headroom`` + 5 % of the limit, never pinned; its upper bound is
  ``--max-batch`` (the window given), not the squeezed answer, which this process does not know. The
  answer is the same boundary as long as it lies below the squeezed answer (the plain program needs no
  less than the squeezed one); ``deviceless_summary.py`` says when it does not.

The JSON (``--json``) is ``fit_for_gpu``'s, with the other search ``null``. Run the two halves as two
processes, side by side, each with its own working folder, checkpoint folder, HOME and jaxfit cache.
"""

from __future__ import annotations

import dataclasses
import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("squeezed", "safe"):
        sys.exit("usage: deviceless_half.py squeezed|safe [jaxfit fit options] --gpu-spec CARD -- COMMAND")
    half = sys.argv[1]
    sys.argv = ["jaxfit", "fit", *sys.argv[2:]]

    import jaxfit.fit.estimate as estimate
    from jaxfit.errors import DoesNotFitError
    from jaxfit.fit.batch import fit_batch

    def fit_for_gpu(source, target, options=estimate.FitOptions(), progress=None, margin=estimate.AUTOTUNE_MARGIN):
        fraction = options.resolved_fraction()
        limit = int(fraction * (options.device_memory_bytes or target.memory_bytes))
        base = dataclasses.replace(options, target=target, pin=False)
        if half == "squeezed":
            search = dataclasses.replace(base, squeeze=True)
        else:
            search = dataclasses.replace(
                base, squeeze=False, headroom_bytes=options.headroom_bytes + int(margin * limit)
            )
        try:
            result = fit_batch(source, search, progress=progress)
        except DoesNotFitError as e:
            print(f"deviceless_half {half}: {e}", flush=True)
            result = None
        if half == "squeezed":
            return estimate.GpuEstimate(target, None, result, margin)
        return estimate.GpuEstimate(target, result, None, margin)

    estimate.fit_for_gpu = fit_for_gpu  # jaxfit.cli.fit imports it at call time
    print(f"deviceless_half: the {half} search of fit_for_gpu only", flush=True)
    from jaxfit.cli import main as cli_main

    return int(cli_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
