"""Which aggregator of a project holds which expert: explicit, balanced by parameters,
and the same for everyone who reads the manifest (volunteers send each contribution to
its expert's aggregator; trainers ask it to referee; each aggregator holds its share).
Pure: a function of the manifest."""

from __future__ import annotations

from collections.abc import Sequence

from core.experts.registry import parameter_count
from core.project.manifest import Manifest
from core.protocol.contributions import TRUNK_UID


def balanced(sizes: Sequence[tuple[str, int]], aggregators: int) -> dict[str, int]:
    """Each (uid, parameters) to an aggregator, in the order given: to the one holding
    the fewest parameters so far (ties: the first). Equal experts are dealt in turn."""
    if aggregators < 1:
        raise ValueError("a project needs an aggregator to assign experts to")
    loads = [0] * aggregators
    out: dict[str, int] = {}
    for uid, size in sizes:
        chosen = min(range(aggregators), key=lambda a: (loads[a], a))
        out[uid] = chosen
        loads[chosen] += size
    return out


def expert_assignment(manifest: Manifest) -> dict[str, int]:
    """uid -> index in ``manifest.aggregators``: the experts in the manifest's order,
    balanced by parameters; then the trainers' trunk (when they share one) to the
    aggregator holding the fewest. The trunk's size is left out of the balance: it needs
    the model's library, which a volunteer does not load, and every party must agree."""
    if not manifest.aggregators:
        return {}
    size = parameter_count(manifest.model.expert_spec())
    out = balanced([(uid, size) for uid in manifest.model.expert_uids()], len(manifest.aggregators))
    loads = [0] * len(manifest.aggregators)
    for index in out.values():
        loads[index] += size
    out[TRUNK_UID] = min(range(len(loads)), key=lambda a: (loads[a], a))
    return out
