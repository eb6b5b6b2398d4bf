"""Planning a queue on a GPU node of a Ray cluster (``jaxfit schedule --plan-on-cluster``).

A cluster's scheduling machine is often its head node, without GPUs (KubeRay), and a fit must
compile on the GPU the runs will use. So the whole planning, ``jaxfit schedule QUEUE --dry-run
--json``, runs as one Ray task on a node with GPUs (as many as the queue's largest run takes),
in the scheduler's working folder when that node has it: the node probes the commands, fits what
the queue leaves ``auto`` and packs the runs onto its GPUs. The plan and the folders of the
programs its fits proved (the pins) come back; the scheduler then runs that plan as it runs one
given with ``--plan``, admitting runs by the cluster's GPUs (docs/guides/how-it-works.md, "Admission on a
cluster"). The nodes need jaxfit and the commands' programs, as they need the programs to train.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxfit._probe import jaxfit_trust as trust
from jaxfit.errors import ConfigError
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.devices import GPU
from jaxfit.schedule.queue_file import Queue

PLAN_TIMEOUT_S = 4 * 3600.0
"""The longest a planning task may take before the scheduler gives up on it."""


def _make_plan_task() -> Callable[..., dict[str, Any]]:
    """The planning task's body, pickled by value (standard library and ``ray`` only)."""

    def jaxfit_plan(
        queue_name: str,
        queue_text: str,
        cwd: str,
        arguments: Sequence[str],
        env: Mapping[str, str],
        pin_key: bytes | None = None,
    ) -> dict[str, Any]:
        import json
        import os
        import shutil
        import socket
        import subprocess
        import sys
        import tempfile

        import ray

        work = tempfile.mkdtemp(prefix="jaxfit-plan-")
        try:
            queue_path = os.path.join(work, queue_name)
            with open(queue_path, "w") as f:
                f.write(queue_text)
            plan_path = os.path.join(work, "plan.json")
            full_env = dict(os.environ)
            full_env.update(env)
            if pin_key:  # the pins are signed with the user's own key, as the scheduler's machine checks them
                key_path = os.path.join(work, "pin-key")
                with os.fdopen(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(pin_key)
                full_env["JAXFIT_PIN_KEY"] = key_path
            proc = subprocess.run(
                [sys.executable, "-m", "jaxfit.cli", "schedule", queue_path, "--dry-run", "--quiet", "--json",
                 plan_path, *arguments],
                cwd=cwd if os.path.isdir(cwd) else work, env=full_env, capture_output=True, text=True,
            )  # fmt: skip
            result: dict[str, Any] = {
                "code": proc.returncode,
                "output": (proc.stdout + proc.stderr)[-6000:],
                "node": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(),
            }
            if proc.returncode == 0:
                with open(plan_path) as f:
                    plan = json.load(f)
                pins: dict[str, dict[str, bytes]] = {}
                for run in plan["runs"]:
                    path = (run.get("pin") or {}).get("path")
                    if path and os.path.isfile(path):
                        folder = os.path.dirname(path)
                        files: dict[str, bytes] = {}
                        for name in os.listdir(folder):
                            if os.path.isfile(os.path.join(folder, name)):
                                with open(os.path.join(folder, name), "rb") as f:
                                    files[name] = f.read()
                        pins[run["name"]] = files
                result.update(plan=plan, pins=pins)
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return jaxfit_plan


def plan_on_cluster(
    queue: Queue,
    ray_address: str,
    *,
    arguments: Sequence[str],
    env: Mapping[str, str] | None = None,
    note: Callable[[str], None] = lambda _text: None,
) -> tuple[str, list[GPU]]:
    """Plan ``queue`` on a GPU node of the cluster at ``ray_address``.

    Args:
      queue: The queue (its file is shipped as it is on disk).
      ray_address: The cluster.
      arguments: ``jaxfit schedule`` arguments for the node's dry run (``--max-batch``,
        ``--probe-arg``, ``--gpus``, ``--device-memory``).
      env: Variables for the node's planning process (the scheduler's own environment stays here).
      note: Called with one line of progress.

    Returns:
      The path of the plan file (in a folder of its own; its pins beside it, their paths
      rewritten) and the GPUs it was made for.

    Raises:
      ConfigError: ray missing, the cluster unreachable, or the node's planning failed (its last
        line).
    """
    from jaxfit.schedule.backends.ray import _first_line, _import_ray, check_reachable

    ray = _import_ray()
    if not ray.is_initialized():
        check_reachable(ray_address)
        try:
            ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            raise ConfigError(f"cannot connect to the Ray cluster at {ray_address!r}: {_first_line(e)}") from None
    want = max([e.gpus for e in queue.experiments if isinstance(e.gpus, int)] or [1])
    available = float(ray.cluster_resources().get("GPU", 0))
    if available < want:
        raise ConfigError(
            f"the Ray cluster at {ray_address!r} has {available:g} GPUs and planning needs a node with {want}; "
            "start the queue once GPU nodes have joined"
        )
    note(f"planning on a node of the Ray cluster with {want} GPU(s)...")
    task = ray.remote(_make_plan_task()).options(num_gpus=want, num_cpus=0, max_retries=0, name="jaxfit:plan")
    try:
        key: bytes | None = trust.load_key(create=True)
    except trust.UntrustedPin:  # no key to be had here: the runs compile their own programs
        key = None
    ref = task.remote(
        Path(queue.source).name, Path(queue.source).read_text(), os.getcwd(), list(arguments), dict(env or {}), key
    )
    try:
        result = ray.get(ref, timeout=PLAN_TIMEOUT_S)
    except ray.exceptions.RayError as e:
        raise ConfigError(f"planning on the Ray cluster failed: {_first_line(e)}") from None
    if result["code"] != 0:
        lines = [line for line in result["output"].splitlines() if line.strip()]
        raise ConfigError(
            f"planning on the Ray cluster's node {result['host']} failed (exit {result['code']}): "
            + (lines[-1].strip() if lines else "no output")
        )
    folder = Path(tempfile.mkdtemp(prefix="jaxfit-cluster-plan-"))
    plan = result["plan"]
    for run in plan["runs"]:
        files = result["pins"].get(run["name"])
        if run.get("pin") and files:
            target = folder / "pins" / run["name"]
            target.mkdir(parents=True, mode=0o700)
            for name, data in files.items():
                with open(os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                    f.write(data)
            run["pin"]["path"] = str(target / Path(run["pin"]["path"]).name)
        elif run.get("pin"):
            run["pin"] = None  # its files did not come back: the run compiles its own program
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    gpus = [GPU(index=int(g["index"]), total_bytes=int(g["total_bytes"])) for g in plan["plan"]["gpus"]]
    note(
        f"planned on {result['host']} (Ray node {str(result['node'])[:8]}): {len(plan['runs'])} runs on "
        f"{len(gpus)} GPU(s) of {format_bytes(gpus[0].total_bytes) if gpus else '?'}"
    )
    return str(path), gpus
