"""``jaxfit gpus``: the GPU models jaxfit compiles for without the card, and capturing a card's own."""

from __future__ import annotations

from typing import Annotated, Literal

import tyro

from jaxfit.cli.app import app, no_command, parsed
from jaxfit.errors import ConfigError, JaxfitError
from jaxfit.fit.targets import Target


def resolve_target(gpu: str | None, gpu_spec: str | None, memory_bytes: int | None) -> Target | None:
    """The card of ``--gpu MODEL`` or ``--gpu-spec FILE`` (``memory_bytes``: ``--device-memory``, another
    size of it), or None when neither is given."""
    from jaxfit.fit import targets

    if gpu and gpu_spec:
        raise JaxfitError("give --gpu MODEL or --gpu-spec FILE, not both")
    if gpu:
        return targets.target_for(targets.find_model(gpu), memory_bytes)
    if gpu_spec:
        return targets.read_spec(gpu_spec, memory_bytes)
    return None


@app.command(name="gpus")
def gpus_command(
    action: Annotated[Literal["list", "capture"], tyro.conf.Positional] = "list",
    out: str | None = None,
) -> int:
    """The GPU models `--gpu` compiles for without the card (list), or a card's own target config (capture).

    `jaxfit gpus list` shows the models (`jaxfit fit --gpu rtx-a6000 --mem-fraction 0.9`,
    `jaxfit plan --gpu h100-sxm --gpu rtx-4090`). `jaxfit gpus capture --out MYCARD.txtpb` on a
    machine with the GPU writes the target config XLA reads off it (what `--gpu-spec` takes), so an
    owner of a card jaxfit does not list can share it. Deviceless compiles need jax's CUDA plugin
    (`pip install "jaxfit[targets]"`); they run on the CPU.

    Args:
        action: list (default) or capture.
        out: With capture: the file to write the card's target config to (default: print it).
    """
    parsed()
    no_command("gpus")
    if action == "capture":
        return _capture(out)
    if out:
        raise ConfigError("--out goes with capture")
    from rich.console import Console
    from rich.table import Table

    from jaxfit.fit.budget import format_bytes
    from jaxfit.fit.targets import MODELS

    table = Table(title="GPU models for --gpu (deviceless estimates)", title_justify="left")
    for column in ("--gpu", "device", "memory", "compute capability", "SMs", "source"):
        table.add_column(column)
    for m in MODELS:
        table.add_row(
            m.key + (f" ({', '.join(m.aliases)})" if m.aliases else ""),
            m.name,
            format_bytes(m.memory_bytes),
            "{}.{}".format(*m.compute_capability),
            str(m.sm_count),
            m.source,
        )
    Console().print(table)
    return 0


def _capture(out: str | None) -> int:
    """Read this machine's first GPU's target config through jax and write it."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        from jax._src.lib import _jax

        devices = [d for d in jax.devices() if d.platform == "gpu"]
        if not devices:
            raise ConfigError(
                f"capture needs a GPU, and JAX here runs on {jax.default_backend()}; run it on the machine with the card"
            )
        text = _jax.get_topology_for_devices(devices[:1]).target_config
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"this jax cannot read a device's target config ({e}); jax 0.10 and newer can") from None
    if isinstance(text, bytes):
        text = text.decode()
    header = f"# jaxfit gpus capture: {devices[0].device_kind}, jax {jax.__version__}\n"
    if out:
        from jaxfit.files import write_text

        write_text(out, header + text, "--out")
        print(out)
    else:
        print(header + text, end="")
    return 0
