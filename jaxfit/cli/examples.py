"""``jaxfit examples``: the built-in workloads, and the example project a pip install carries."""

from __future__ import annotations

from rich.console import Console

from jaxfit.cli.app import app, no_command, parsed


@app.command(name="examples")
def examples_command(copy: str | None = None, overwrite: bool = False) -> None:
    """List the built-in example workloads and what they are; with --copy DIR, write the example
    training script and queue files into DIR.

    --copy DIR writes DIR/scripts/train.py (an openpi-style training script of the example models:
    `python scripts/train.py debug --exp-name=x`) and DIR/configs/queue-debug.yaml and
    queue-96gb.yaml (queues for `jaxfit schedule`), so that the README's script, run, tune, plan and
    schedule commands work from DIR after a pip install.

    Args:
      copy: Write the example training script and queue files into this folder (created if missing).
      overwrite: With --copy, replace files that exist already (otherwise they are refused, and nothing is written).
    """
    parsed()
    no_command("examples")
    if copy is not None:
        from jaxfit.examples.starter import copy_starter

        for path in copy_starter(copy, overwrite=overwrite):
            print(path)
        print(f"next: cd {copy} && jaxfit fit --script -- python scripts/train.py debug --exp-name=first")
        return
    if overwrite:
        from jaxfit.errors import ConfigError

        raise ConfigError("--overwrite goes with --copy DIR")
    from rich.table import Table

    from jaxfit.examples import DEFAULT_EXAMPLE, example_description, list_examples, load_config

    table = Table(title="built-in examples (jaxfit fit --example NAME)", title_justify="left")
    table.add_column("name")
    table.add_column("family")
    table.add_column("description")
    for name in list_examples():
        family = load_config(name).family
        table.add_row(name + (" (default)" if name == DEFAULT_EXAMPLE else ""), family, example_description(name))
    Console().print(table)
