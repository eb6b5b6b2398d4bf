"""A training process for a built-in example, as ``jaxfit tune`` measures it.

``python -m jaxfit.tune.trial --example NAME [--set KEY=VALUE ...] --batch B`` initialises the
example's real state and trains on synthetic batches of B, calling the step jitted exactly as the
fit compiled it (:meth:`jaxfit.Workload.jitted`), so the pinned program is loaded when jaxfit's
start-up hook and ``JAXFIT_PIN`` are there, and the hook's measurement (``JAXFIT_MEASURE``) ends
the process after its timed steps. Not a public interface.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxfit.tune.trial")
    parser.add_argument("--example", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--max-steps", type=int, default=10_000)
    args = parser.parse_args(argv)

    import jax

    from jaxfit.examples import (
        build_workload,
        init_state,
        load_config,
        make_optimizer,
        parse_overrides,
        synthetic_batch,
    )

    overrides = parse_overrides(args.set)
    cfg = load_config(args.example, overrides)
    workload = build_workload(args.example, overrides)
    state = jax.jit(lambda key: init_state(cfg, key, make_optimizer(cfg))[1])(jax.random.key(0))
    batch = synthetic_batch(cfg, args.batch, jax.random.key(1))
    step = workload.jitted()
    for _ in range(args.max_steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
