"""What one compile says about memory: XLA's ``memory_analysis()`` reduced to the fields that matter."""

from __future__ import annotations

import dataclasses
from typing import Any

FIELDS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes")


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """XLA's memory analysis of one compiled step.

    The step's peak device memory is ``argument + output - alias + temp + generated code``: the
    arguments stay live for the whole step, donated arguments alias their outputs, and XLA takes
    the temporaries as one allocation. On an H200 this equalled the allocator's measured
    ``peak_bytes_in_use`` to the MiB (docs/facts.md #1).

    Attributes:
      argument_bytes: Bytes of the step's inputs (state + batch).
      output_bytes: Bytes of its outputs.
      alias_bytes: Output bytes that reuse donated input buffers.
      temp_bytes: Bytes of temporaries (activations, gradients, workspace).
      generated_code_bytes: Bytes of generated code held on the device.
      flops: XLA's cost-analysis FLOP count of one step, when it gives one.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int = 0
    flops: float | None = None

    @property
    def peak_bytes(self) -> int:
        """Peak device bytes of one step: argument + output - alias + temp + generated code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.generated_code_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``peak_bytes`` included."""
        d = dataclasses.asdict(self)
        d["peak_bytes"] = self.peak_bytes
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryReport:
        """Inverse of :meth:`to_dict` (``peak_bytes`` is recomputed, not read)."""
        return cls(**{k: d[k] for k in (*FIELDS, "flops") if k in d})


def analyse(compiled: Any) -> MemoryReport:
    """Read the memory analysis (and FLOPs, where available) of a ``jax.stages.Compiled``."""
    from jaxfit._probe.jaxfit_compile_server import memory_of

    return MemoryReport.from_dict(memory_of(compiled))
