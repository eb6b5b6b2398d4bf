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
    ``peak_bytes_in_use`` to the MiB (docs/guides/facts.md #1).

    Attributes:
      argument_bytes: Bytes of the step's inputs (state + batch).
      output_bytes: Bytes of its outputs.
      alias_bytes: Output bytes that reuse donated input buffers.
      temp_bytes: Bytes of temporaries (activations, gradients, workspace).
      generated_code_bytes: Bytes of generated code held on the device.
      flops: XLA's cost-analysis FLOP count of one step, when it gives one.
      next_input_bytes: What the training loop holds on the device beside the step (GPU only,
        set by the parent: :func:`next_input_bytes`): the next batch, put there while this step
        runs. A fit leaves room for it (:attr:`need_bytes`).
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int = 0
    flops: float | None = None
    next_input_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """Peak device bytes of one step: argument + output - alias + temp + generated code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.generated_code_bytes

    @property
    def need_bytes(self) -> int:
        """What a training process needs in its pool for this step: its peak and the next batch."""
        return self.peak_bytes + self.next_input_bytes

    def need_words(self) -> str:
        """:attr:`need_bytes` for people: the peak, and on a GPU the next batch beside it
        (``71.77 GiB + 67.27 MiB for the next batch``)."""
        from jaxfit.fit.budget import format_bytes

        peak = format_bytes(self.peak_bytes)
        return f"{peak} + {format_bytes(self.next_input_bytes)} for the next batch" if self.next_input_bytes else peak

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``peak_bytes`` and ``need_bytes`` included."""
        d = dataclasses.asdict(self)
        d["peak_bytes"] = self.peak_bytes
        d["need_bytes"] = self.need_bytes
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryReport:
        """Inverse of :meth:`to_dict` (``peak_bytes`` and ``need_bytes`` are recomputed, not read)."""
        return cls(**{k: d[k] for k in (*FIELDS, "flops", "next_input_bytes") if k in d})


def next_input_bytes(memory: MemoryReport) -> int:
    """The next batch a training loop holds on the device while a step runs, as the step's inputs
    that are not donated (``argument - alias``: the batch, a random key; the donated state is
    updated in place); 0 for a step that donates nothing (its inputs and outputs are counted apart
    in its peak already).

    A loop that dispatches step N and then fetches batch N + 1 (openpi's ``train.py``, and any
    loop that prefetches) has both batches in the pool at once. On an H200 standing for an 80 GiB
    card, pi0.5 at batch 40 (peak 71.99 GiB of 72.00, 6.5 MB to spare; 72.3 MB of inputs a batch)
    ran two steps and ran out of memory in the third (benchmarks/JOURNAL.md section 20)."""
    return max(0, memory.argument_bytes - memory.alias_bytes) if memory.alias_bytes else 0


def analyse(compiled: Any) -> MemoryReport:
    """Read the memory analysis (and FLOPs, where available) of a ``jax.stages.Compiled``."""
    from jaxfit._probe.jaxfit_compile_server import memory_of

    return MemoryReport.from_dict(memory_of(compiled))
