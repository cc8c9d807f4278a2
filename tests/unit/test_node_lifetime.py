"""The dashboard shows two token counts, this run's and everything given so far; the
history records every 10 s, and what came since its last record is counted in both, so
"given so far" is never below "since the node started"."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import cast

from core.node.history import History
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from core.node.serving import ProjectService
from net import Identity


@dataclass
class _Serving:
    """The two counters the node reads from its ProjectService."""

    done: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    server: object | None = None

    def samples_done(self) -> int:
        return self.done


def test_given_so_far_counts_what_came_since_the_last_record(tmp_path):
    node = Node(
        Identity.generate(),
        NodeOptions(data_dir=tmp_path / "data", config_dir=tmp_path / "config"),
        probes=FakeProbes(),
    )
    node.history = History(tmp_path / "history.sqlite")
    serving = _Serving()
    node.serving = cast(ProjectService, serving)
    try:
        # (tokens computed so far, accepted so far, record now?)
        for done, accepted, record in [
            (0, 0, False),
            (640, 1, False),
            (640, 1, True),
            (1_280, 3, False),
            (2_000, 3, True),
            (2_048, 4, False),
        ]:
            serving.done, serving.outcomes["accepted"] = done, accepted
            if record:
                node._record_work(10.0)
            lifetime = node._lifetime()  # what the status's "lifetime" carries
            assert lifetime.samples == done  # == the status's samples_done, this first run
            assert lifetime.contributions_accepted == accepted
        # a second run on the same history adds to the totals
        node.history.close()
        again = Node(node.identity, node.options, probes=FakeProbes())
        again.history = History(tmp_path / "history.sqlite")
        again.serving = cast(ProjectService, _Serving(done=100, outcomes=Counter(accepted=1)))
        lifetime = again._lifetime()
        assert (lifetime.samples, lifetime.contributions_accepted) == (2_000 + 100, 3 + 1)
        again.history.close()
    finally:
        if node.history is not None:
            node.history.close()
