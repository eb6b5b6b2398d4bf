"""A script's step compiled for a GPU that is not here (``jaxfit fit --script --gpu MODEL``).

The script runs on the CPU (``JAX_PLATFORMS=cpu``, the CUDA plugin installed) up to its first call
of the step, as any probe. Its step is then exported for CUDA at each candidate batch
(``jax.export``: traced on the script's own thread, lowered with CUDA's lowering rules, on the
CPU) and the exported program is compiled for compile-only devices of the card's target config
(``get_topology_desc``), its arguments placed on those devices as the script placed them on its
own (one device, or a mesh of the same shape), donating what the step donates. On a CPU machine
this gave the same memory analysis, to the byte, as a ``jax.jit`` of the step lowered directly for
those devices.

Standard library and jax only, Python 3.9+: it runs in the script's environment.
"""

import json
import os
import re
from typing import Any, Dict, Optional, Sequence

TARGET_ENV = "JAXFIT_TARGET"
"""A JSON file ``{"name", "spec", "limit"}``: the card's target config (with the
``device_memory_size`` the compiler is to see) and its limit under the fraction."""


def load() -> Optional[Dict[str, Any]]:
    """The target this probe compiles for, or None (the script's own device)."""
    path = os.environ.get(TARGET_ENV)
    if not path:
        return None
    with open(path) as f:
        return dict(json.load(f))


MEMORY_FIELD = re.compile(r"device_memory_size:\s*(\d+)")
"""A target config's ``device_memory_size``: the memory the compiler sees."""


def compiler_memory(spec: str) -> Optional[int]:
    """The ``device_memory_size`` of a target config."""
    found = MEMORY_FIELD.search(spec)
    return int(found.group(1)) if found else None


def info_fields(target: Dict[str, Any], device_count: int) -> Dict[str, Any]:
    """What a compile server for ``target`` reports of its devices: the card's limit, as a GPU's."""
    return {
        "topology": "target",
        "platform": "gpu",
        "device_kind": target["name"],
        "device_count": device_count,
        "bytes_limit": target["limit"],
        "limit_sensitive": True,
        "compiler_memory": compiler_memory(target["spec"]),
    }


def device_count(tree: Any) -> int:
    """How many devices the arrays of ``tree`` are placed on together (1 for arrays on one device)."""
    import jax

    count = 1
    for x in jax.tree_util.tree_leaves(tree):
        devices = getattr(getattr(x, "sharding", None), "device_set", None)
        if devices:
            count = max(count, len(devices))
    return count


class NoTopology(Exception):
    """No compile-only devices for a target config here. ``unreadable``: this jaxlib cannot parse
    the config (else: no CUDA plugin, or another failure); the message is jax's first line."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.unreadable = "parse" in text.lower()


NEWER_FIELDS = ("collective_memory_granularity", "scalar_unit_description", "matrix_unit_description")
"""Fields of newer XLA target configs that jax 0.10.2's jaxlib does not know ("Failed to parse
GpuTargetConfigProto"); none of them changes a memory analysis."""

OLDER_JAXLIB_FIELDS = NEWER_FIELDS + (
    "thread_dim_limit_x",
    "thread_dim_limit_y",
    "thread_dim_limit_z",
    "feature_extension",
)
"""What a config is read again without when this jaxlib cannot parse it: also the fields jax 0.6.2's
and 0.7.2's do not know."""

SKIP_CUDA_CHECK_ENV = "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"
"""jax's switch that skips its CUDA plugin's check of the CUDA versions against the GPU's driver:
on a machine without a GPU the check fails (``cuInit``) and the plugin of jax 0.6 and 0.7 does not
start, so no GPU could be compiled for. Set in a probe for a GPU that is not here."""


def drop_unknown_fields(text: str, fields: "Sequence[str]" = NEWER_FIELDS) -> str:
    """``text`` without comments and ``fields`` (their blocks too)."""
    out = []
    skipping = 0
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].strip() if '"' not in line else line.strip()
        if not stripped:
            continue
        if skipping:
            skipping += stripped.count("{") - stripped.count("}")
            continue
        head = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*[:{]", stripped)
        if head and head.group(1) in fields:
            skipping = stripped.count("{") - stripped.count("}")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def make_devices(spec: str, count: int) -> "list[Any]":
    """``count`` compile-only devices of the GPU of ``spec``; a config this jaxlib cannot parse is
    read again without the fields older jaxlibs lack (:data:`OLDER_JAXLIB_FIELDS`).

    Raises:
      NoTopology: jax here has no CUDA plugin, or it cannot read the config.
    """
    from jax.experimental import topologies

    def topology(text: str) -> Any:
        try:
            return topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x%d" % count)
        except Exception as e:  # the plugin missing, or a config it cannot parse
            raise NoTopology(str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    try:
        found = topology(spec)
    except NoTopology as e:
        older = drop_unknown_fields(spec, OLDER_JAXLIB_FIELDS)
        if not e.unreadable or older == spec:
            raise
        found = topology(older)
    return list(found.devices)[:count]


def _placed(sharding: Any, devices: "Sequence[Any]") -> Any:
    """The sharding of the target's ``devices`` that places an array as ``sharding`` does on the
    script's own."""
    import jax
    import numpy as np

    mesh = getattr(sharding, "mesh", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and mesh is not None:
        grid = np.array(list(devices)[: mesh.devices.size], dtype=object).reshape(mesh.devices.shape)
        return jax.sharding.NamedSharding(jax.sharding.Mesh(grid, mesh.axis_names), sharding.spec)
    if sharding is None or len(getattr(sharding, "device_set", ())) <= 1:
        return jax.sharding.SingleDeviceSharding(devices[0])
    raise RuntimeError(
        "the step takes an array placed by a %s over %d devices; only one device or a named mesh is compiled "
        "for a GPU that is not here" % (type(sharding).__name__, len(sharding.device_set))
    )


def lower_for(
    jitted: Any,
    args: tuple,
    kwargs: dict,
    devices: "Sequence[Any]",
    donated: "Sequence[int]",
    static: "tuple[frozenset, frozenset]",
    rebuilt: Any,
) -> Any:
    """The step ``jitted`` at these (abstract or real) arguments, lowered for the target's
    ``devices``: exported for CUDA, then called on its arguments placed on those devices
    (``rebuilt(tree, leaf)`` maps every array of a tree) without the ``static`` ones (positions,
    names), which the export took in, donating the positions ``donated``."""
    import jax
    from jax import export

    exported = export.export(jitted, platforms=["cuda"])(*args, **kwargs)
    positions, names = static
    kept_positions = [i for i in range(len(args)) if i not in positions]
    dynamic_args = tuple(args[i] for i in kept_positions)
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in names}

    def leaf(x: Any) -> Any:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_placed(getattr(x, "sharding", None), devices))

    placed = rebuilt((dynamic_args, dynamic_kwargs), leaf)
    # jax.jit leaves out the arguments a step does not use (keep_unused=False); the exported call
    # takes them all, so the program compiled here takes only those the export kept and makes the
    # rest inside itself, where XLA drops them: its arguments are the card's program's
    flat, tree = jax.tree_util.tree_flatten(placed)
    kept = sorted(getattr(exported, "module_kept_var_idx", range(len(flat))))
    owner = []  # the dynamic argument (position, or -1 for a keyword) each leaf belongs to
    for position, arg in enumerate(placed[0]):
        owner += [position] * len(jax.tree_util.tree_leaves(arg))
    owner += [-1] * (len(flat) - len(owner))
    donated_dynamic = {kept_positions.index(i) for i in donated if i in kept_positions}

    def program(*kept_leaves: Any) -> Any:
        given = dict(zip(kept, kept_leaves))
        leaves = [given[i] if i in given else _unused(x) for i, x in enumerate(flat)]
        call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, leaves)
        return exported.call(*call_args, **call_kwargs)

    donate = tuple(j for j, i in enumerate(kept) if owner[i] in donated_dynamic)
    return jax.jit(program, donate_argnums=donate).lower(*[flat[i] for i in kept])


def _unused(x: Any) -> Any:
    """A stand-in for an argument the step does not use, made inside the program (XLA drops it)."""
    import jax
    import jax.numpy as jnp

    if not hasattr(x, "dtype"):  # a Python number: passed as it is
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed PRNG key: zeros of its key data
        impl = x.dtype._impl
        return jax.random.wrap_key_data(jnp.zeros(tuple(x.shape) + tuple(impl.key_shape), jnp.uint32), impl=impl)
    return jnp.zeros(x.shape, x.dtype)
