"""What-if tables: the largest global batch for cards and device counts you may not have.

``jaxfit plan`` fits a step for every card size x device count x FSDP size, each compiled under
the limit that card and fraction would give (the ``--device-memory`` mechanism of
:mod:`jaxfit.fit.batch`), on this machine's devices, host devices on a CPU, or a mocked GPU
topology for device counts larger than those present (:mod:`jaxfit.fit.mesh`).
"""

from jaxfit.plan.whatif import DEFAULT_CARDS, Card, Cell, PlanResult, parse_card, what_if

__all__ = ["DEFAULT_CARDS", "Card", "Cell", "PlanResult", "parse_card", "what_if"]
