"""The compile child: a process that sees the *target* memory limit and answers "peak at batch B".

XLA squeezes a step toward the allocator limit it sees (FACTS.md #2), so the memory analysis is
only right when it comes from a process whose ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is the target
one. The parent (:mod:`jaxfit.compiler`) starts this module with that fraction and preallocation
off (compiling allocates nothing, so other jobs on the GPU are undisturbed, FACTS.md #3), then
talks to it in JSON lines: requests on stdin, answers on the file descriptor given by
``--reply-fd`` (so that anything the user's code prints to stdout cannot garble the protocol).

Run as ``python -m jaxfit.worker --spec JSON --reply-fd N``. Not a public interface.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, TextIO

OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def is_out_of_memory(message: str) -> bool:
    """Whether an exception text is XLA's out-of-memory error (FACTS.md #8)."""
    return any(marker in message for marker in OOM_MARKERS)


def host_memory_bytes() -> int:
    """Physical memory available to this process: the machine's RAM or a smaller cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return total


class Worker:
    """Builds the workload once, then compiles it at the batch sizes it is asked for."""

    def __init__(self, spec: dict[str, Any], reply: TextIO) -> None:
        self.spec = spec
        self._reply = reply
        self._reply_lock = threading.Lock()
        self._lower_lock = threading.Lock()  # tracing is cheap and not guaranteed thread-safe
        self.workload: Any = None
        self.info: dict[str, Any] = {}
        self.cache: Any = None

    def send(self, message: dict[str, Any]) -> None:
        with self._reply_lock:
            self._reply.write(json.dumps(message) + "\n")
            self._reply.flush()

    def start(self) -> None:
        """Initialise JAX, build the workload and report the device."""
        import jax

        from jaxfit import cache as cache_mod
        from jaxfit.sources import build_workload

        device = jax.devices()[0]
        stats = None
        try:
            stats = device.memory_stats()
        except Exception:  # some backends raise instead of returning None
            stats = None
        platform = device.platform
        limit_sensitive = platform in ("gpu", "cuda", "rocm")
        bytes_limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
        self.info = {
            "platform": platform,
            "device_kind": getattr(device, "device_kind", platform),
            "device_count": jax.device_count(),
            "bytes_limit": bytes_limit,
            "limit_sensitive": limit_sensitive,
            "host_memory_bytes": host_memory_bytes(),
            "jax_version": jax.__version__,
            "mem_fraction_env": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        }
        if self.spec.get("cache_path"):
            self.cache = cache_mod.CompileCache(self.spec["cache_path"])
        self.workload = build_workload(self.spec["source"])
        self.info["workload"] = {"name": self.workload.name, "description": dict(self.workload.description)}
        self.send({"op": "ready", "info": self.info})

    def _cache_key(self, fingerprint: str, options: dict[str, Any]) -> str:
        parts = {
            "fingerprint": fingerprint,
            # The limit matters only where the compiler sees it (GPU); on the CPU it does not.
            "limit": self.info["bytes_limit"] if self.info["limit_sensitive"] else None,
            "jax": self.info["jax_version"],
            "device": self.info["device_kind"],
            "devices": self.info["device_count"],
            "options": options,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def compile_one(self, batch: int, autotune: bool) -> dict[str, Any]:
        """Lower and compile at ``batch``; never raises (errors are answers)."""
        from jaxfit.memory import analyse

        start = time.perf_counter()
        try:
            with self._lower_lock:
                lowered = self.workload.lower(batch)
                fingerprint = hashlib.sha256(lowered.as_text().encode()).hexdigest()
            options: dict[str, Any] = {}
            if self.info["limit_sensitive"] and not autotune:
                options["xla_gpu_autotune_level"] = 0  # peaks within 0.03 %, 3x faster (FACTS.md #6)
            key = self._cache_key(fingerprint, options)
            if self.cache is not None:
                hit = self.cache.get(key)
                if hit is not None:
                    return {"batch": batch, "ok": True, "memory": hit, "cached": True,
                            "compile_s": time.perf_counter() - start, "fingerprint": fingerprint}
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
            memory = analyse(compiled).to_dict()
            if self.cache is not None:
                self.cache.put(key, memory)
            return {"batch": batch, "ok": True, "memory": memory, "cached": False,
                    "compile_s": time.perf_counter() - start, "fingerprint": fingerprint}
        except Exception as e:  # an answer, not a crash: the parent decides what it means
            message = f"{type(e).__name__}: {e}"
            return {"batch": batch, "ok": False, "oom": is_out_of_memory(message),
                    "error": message, "traceback": traceback.format_exc(limit=8),
                    "compile_s": time.perf_counter() - start}

    def compile_many(self, request: dict[str, Any]) -> None:
        batches = [int(b) for b in request["batches"]]
        threads = max(1, int(request.get("threads", len(batches))))
        autotune = bool(request.get("autotune", True))
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self.compile_one, b, autotune) for b in batches]
            for future in concurrent.futures.as_completed(futures):
                self.send({"op": "result", "id": request.get("id"), **future.result()})
        self.send({"op": "done", "id": request.get("id")})

    def process_overhead(self) -> dict[str, Any]:
        """Device memory this process holds outside the XLA pool (CUDA context, libraries).

        Measured as the process's used memory according to nvidia-smi minus the pool's bytes,
        after a small matmul has loaded the math libraries (FACTS.md #5).
        """
        if not self.info["limit_sensitive"]:
            return {"op": "overhead", "bytes": 0, "method": "none: not a GPU"}
        import jax
        import jax.numpy as jnp

        for dtype in (jnp.float32, jnp.bfloat16):
            x = jnp.ones((256, 256), dtype)
            jax.block_until_ready(jax.jit(lambda a: a @ a)(x))
        stats = jax.devices()[0].memory_stats() or {}
        pool = int(stats.get("pool_bytes", stats.get("bytes_reserved", stats.get("bytes_in_use", 0))))
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            return {"op": "overhead", "bytes": None, "method": f"nvidia-smi unavailable: {e}"}
        for line in out.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(os.getpid()) and fields[1].isdigit():
                used = int(fields[1]) << 20
                return {"op": "overhead", "bytes": max(0, used - pool), "method": "nvidia-smi minus pool",
                        "process_used_bytes": used, "pool_bytes": pool}
        return {"op": "overhead", "bytes": None, "method": "this process is not in nvidia-smi's list"}

    def serve(self, requests: TextIO) -> None:
        for line in requests:
            if not line.strip():
                continue
            request = json.loads(line)
            op = request.get("op")
            if op == "compile":
                self.compile_many(request)
            elif op == "overhead":
                self.send(self.process_overhead())
            elif op == "quit":
                return
            else:
                self.send({"op": "error", "kind": "protocol", "message": f"unknown op {op!r}"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxfit.worker")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args(argv)
    reply = os.fdopen(args.reply_fd, "w", buffering=1)
    spec = json.loads(args.spec)
    worker = Worker(spec, reply)
    try:
        worker.start()
    except Exception as e:
        from jaxfit.errors import JaxfitError

        kind = "user" if isinstance(e, JaxfitError) else "internal"
        worker.send({"op": "error", "kind": kind, "error_class": type(e).__name__,
                     "message": f"{e}" if kind == "user" else f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc(limit=8)})
        return 3
    worker.serve(sys.stdin)
    return 0


if __name__ == "__main__":
    # The user's code may print; keep the protocol on its own descriptor and send prints to stderr.
    sys.stdout = sys.stderr
    sys.exit(main())
