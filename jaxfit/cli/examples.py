"""``jaxfit examples``: the built-in workloads."""

from __future__ import annotations

from rich.console import Console

from jaxfit.cli.app import app, parsed


@app.command(name="examples")
def examples_command() -> None:
    """List the built-in example workloads and what they are."""
    parsed()
    from rich.table import Table

    from jaxfit.examples import DEFAULT_EXAMPLE, example_description, list_examples, load_config

    table = Table(title="built-in examples (configs/*.yaml)", title_justify="left")
    table.add_column("name")
    table.add_column("family")
    table.add_column("description")
    for name in list_examples():
        family = load_config(name).family
        table.add_row(name + (" (default)" if name == DEFAULT_EXAMPLE else ""), family, example_description(name))
    Console().print(table)
