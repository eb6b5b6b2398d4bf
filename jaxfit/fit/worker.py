"""The compile child: a process that sees the *target* memory limit and answers "peak at batch B".

XLA squeezes a step toward the allocator limit it sees (docs/guides/facts.md #2), so the memory analysis is
only right when it comes from a process whose ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is the target
one. The parent (:mod:`jaxfit.fit.compiler`) starts ``python -m jaxfit.fit.worker`` with that fraction and
preallocation off (compiling allocates nothing, so other jobs on the GPU are undisturbed,
docs/guides/facts.md #3), with the workload source in ``$JAXFIT_WORKLOAD_SOURCE``. The protocol is that of
:mod:`jaxfit._probe.jaxfit_compile_server`, which the script probe speaks too. Not a public interface.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jaxfit._probe import jaxfit_compile_server as server_mod
from jaxfit._probe.jaxfit_target import info_fields
from jaxfit._probe.jaxfit_target import load as _target

SOURCE_ENV = "JAXFIT_WORKLOAD_SOURCE"


def _served(text: str, topology: str) -> dict[str, Any]:
    """What the compile server needs of the workload of a source (JSON): its ``lower``, its
    ``workload`` info, and the ``components``, ``concrete`` arguments and ``donated`` positions."""
    from jaxfit.fit.mesh import MeshSpec
    from jaxfit.fit.sources import build_workload, from_json

    source = from_json(text)
    mesh = getattr(source, "mesh", None) or MeshSpec()
    workload = build_workload(source)
    description = dict(workload.description, step_name=server_mod.function_name(workload.step_fn))
    if "mesh" not in description:  # a workload that brings its own shardings
        own = server_mod.mesh_of(workload.abstract_args(max(1, mesh.devices)))
        if own:
            description["mesh"] = own

    def components(batch: int) -> list:
        args = workload.abstract_args(batch)
        names = server_mod.argument_names(workload.step_fn, len(args))
        return server_mod.describe_arguments(
            args, names, workload.batch_argnum % len(args), description.get("field_names")
        )

    def concrete(batch: int) -> tuple:
        return tuple(server_mod.real_arguments(tuple(workload.abstract_args(batch))))

    return {
        "lower": workload.lower,
        "workload": {"name": workload.name, "description": description},
        "components": components,
        "concrete": None if topology in ("mock", "target") else concrete,  # compile-only devices cannot run
        "donated": workload.donate_argnums,
    }


def main() -> int:
    requests, replies = server_mod.open_channels()
    try:
        from jaxfit.errors import ConfigError
        from jaxfit.fit.mesh import MeshSpec, prepare_devices
        from jaxfit.fit.sources import from_json

        first = os.environ[SOURCE_ENV]
        mesh = getattr(from_json(first), "mesh", None) or MeshSpec()
        target = _target()
        if target is not None:  # a GPU that is not here: compile-only devices of its config, on the CPU
            from jaxfit.fit.mesh import use_target_devices

            use_target_devices(target["spec"], mesh.devices)
            topology = "target"
        else:
            topology = prepare_devices(mesh.devices, mesh.allow_mock)  # before JAX starts its backend
        parts = _served(first, topology)

        def loader(text: str) -> dict[str, Any]:  # the devices were set up for the first mesh
            if (getattr(from_json(text), "mesh", None) or MeshSpec()) != mesh:
                raise ConfigError("a compile process serves workloads of one mesh; start another for this one")
            return _served(text, topology)

        server = server_mod.Server(
            parts["lower"],
            replies,
            parts["workload"],
            cache_path=os.environ.get(server_mod.CACHE_PATH_ENV) or None,
            components=parts["components"],
            concrete=parts["concrete"],
            donated=parts["donated"],
            loader=loader,
        )
        server.info.update(topology=topology, mesh_devices=mesh.devices)
        if target is not None:  # what the compiler sees: the card's limit, as a GPU's
            server.info.update(info_fields(target, mesh.devices))
    except Exception as e:
        from jaxfit.errors import JaxfitError

        user = isinstance(e, JaxfitError)
        server_mod.send_error(
            replies, "user" if user else "internal", type(e).__name__, str(e) if user else f"{type(e).__name__}: {e}"
        )
        return 3
    server.ready()
    server.serve(requests)
    return 0


if __name__ == "__main__":
    # The user's code may print; the protocol has its own descriptors, and prints go to stderr.
    sys.stdout = sys.stderr
    sys.exit(main())
