"""The node's status is a pure function of a snapshot: every state and reason, from a table."""

from __future__ import annotations

from collections import Counter

import pytest

from core.node.capacity import DevicePlan
from core.node.probes import Reading
from core.node.status import NodeSnapshot, build_status
from core.node.throttle import Decision, Reason

WORKING = Decision(True, None)
TOO_HOT = Decision(False, Reason.GPU_HOT, "90 °C")


@pytest.mark.parametrize(
    ("snapshot", "state", "reason_starts", "code"),
    [
        (NodeSnapshot(), "no project", "join a project", ""),
        (NodeSnapshot(project="p" * 32), "starting", "joining the project", ""),
        (
            NodeSnapshot(project="p" * 32, project_error="no manifest"),
            "error",
            "cannot join the project: no manifest",
            "",
        ),
        # a server that runs outranks an old error (it was fixed by a retry)
        (
            NodeSnapshot(
                project="p" * 32, project_error="old", serving=True, decision=WORKING, peers=3
            ),
            "working",
            "working",
            "",
        ),
        # allowed to work, serving, but no peer of the swarm: nobody to work for
        (
            NodeSnapshot(project="p" * 32, serving=True, decision=WORKING, peers=0),
            "starting",
            "waiting for the swarm",
            "",
        ),
        (NodeSnapshot(project="p" * 32, serving=True), "starting", "joining", ""),
        # banned by the project: said plainly, even while the server still runs
        (
            NodeSnapshot(
                project="p" * 32,
                serving=True,
                decision=WORKING,
                peers=3,
                banned="its forward answer of ffn0.0.1 is wrong",
            ),
            "error",
            "banned from the project: its forward answer of ffn0.0.1 is wrong",
            "",
        ),
        (
            NodeSnapshot(project="p" * 32, serving=True, decision=TOO_HOT),
            "paused",
            TOO_HOT.describe(),
            "gpu_hot",
        ),
        # serving, but the work is not counted: the aggregator is gone, or needs none
        # of it for now ("Working" said so at 8609050, while the node filled its disk)
        (
            NodeSnapshot(
                project="p" * 32,
                serving=True,
                decision=WORKING,
                peers=3,
                contributions_problem="the project's aggregator has not answered for 5 min",
            ),
            "waiting",
            "the project's aggregator has not answered for 5 min",
            "",
        ),
        # a pause outranks it: the volunteer's own limits come first
        (
            NodeSnapshot(
                project="p" * 32,
                serving=True,
                decision=TOO_HOT,
                peers=3,
                contributions_problem="the project's aggregator has not answered for 5 min",
            ),
            "paused",
            TOO_HOT.describe(),
            "gpu_hot",
        ),
    ],
)
def test_state_and_reason(snapshot, state, reason_starts, code):
    status = build_status(snapshot)
    assert status.state == state
    assert status.reason.startswith(reason_starts)
    assert status.reason_code == code


def test_figures_are_carried_over():
    status = build_status(
        NodeSnapshot(
            project="p" * 32,
            serving=True,
            decision=WORKING,
            experts={"ffn.1": 3, "ffn.0": 2},
            sent=7,
            outcomes=Counter({"accepted": 4, "given_up": 1, "stale": 2}),
            reading=Reading(gpu_temp_c=61.0, idle_seconds=400.0),
            device_plan=DevicePlan("cpu", 2**30, "1.0 GB of 4.0 GB"),
            uptime_s=12.6,
        )
    )
    assert list(status.experts) == ["ffn.0", "ffn.1"]
    assert status.contributions.sent == 7
    assert status.contributions.accepted == 4
    assert status.contributions.given_up == 1
    assert status.contributions.refused == {"stale": 2}
    assert status.readings.gpu_temp_c == 61.0
    assert status.readings.cpu_temp_c is None
    assert status.device.device == "cpu"
    assert status.uptime_s == 13


LAN = "/ip4/192.168.1.20/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
LOCAL = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


@pytest.mark.parametrize(
    ("addresses", "verdict", "relayed", "reach", "says", "advises"),
    [
        ((), "unknown", False, "off", "not listening", ""),
        ((LOCAL,), "unknown", False, "this computer only", "only programs on this", "Limits"),
        (
            (LOCAL.replace("127.0.0.1", "::1").replace("ip4", "ip6"),),
            "public",
            False,
            "this computer only",
            "only programs",
            "Reachable",
        ),
        ((LAN, LOCAL), "unknown", False, "checking", "checking whether", ""),
        ((LAN, LOCAL), "public", False, "direct", "reachable directly", ""),
        # a dial-back that failed is "unreachable" until a relay holds a place for us
        (
            (LAN, LOCAL),
            "private",
            False,
            "unreachable",
            "router or a firewall blocks",
            "forward TCP port 4001",
        ),
        (
            (LAN, LOCAL),
            "private",
            False,
            "unreachable",
            "router or a firewall blocks",
            "tick “Ask the router to forward a port (UPnP)”",
        ),
        (
            (LAN, LOCAL),
            "private",
            True,
            "relayed",
            "reachable through a relay",
            "nothing is needed",
        ),
    ],
)
def test_the_status_says_plainly_how_the_node_is_reached(
    addresses, verdict, relayed, reach, says, advises
):
    _the_status_says(addresses, verdict, relayed, reach, says, advises, port_mapping=None)


@pytest.mark.parametrize(
    ("port_mapping", "advises", "not_advised"),
    [
        (None, "tick “Ask the router to forward a port (UPnP)”", "asked by UPnP"),
        ("", "forward TCP port 4001", "UPnP"),
        ("no router answered", "the router did not: no router answered", "tick"),
    ],
)
def test_the_advice_follows_the_port_mapping(port_mapping, advises, not_advised):
    snap = NodeSnapshot(addresses=(LAN, LOCAL), verdict="private", port_mapping=port_mapping)
    advice = build_status(snap).network.advice
    assert advises in advice
    assert not_advised not in advice


def _the_status_says(
    addresses: tuple[str, ...],
    verdict: str,
    relayed: bool,
    reach: str,
    says: str,
    advises: str,
    port_mapping: str | None,
) -> None:
    snap = NodeSnapshot(
        addresses=addresses,
        inbound_from_network=2,
        verdict=verdict,
        relayed=relayed,
        observed_ip="198.18.0.100" if verdict != "unknown" else None,
        port_mapping=port_mapping,
    )
    network = build_status(snap).network
    assert network.addresses == list(addresses)
    assert network.inbound_from_network == 2
    assert network.reach == reach
    assert says in network.reachability
    assert advises in network.advice
    if not advises:
        assert network.advice == ""
    if reach in ("direct", "relayed", "unreachable"):
        assert "seen at 198.18.0.100" in network.reachability


@pytest.mark.parametrize(("decision", "listed"), [(WORKING, {"ffn.0.1": 3}), (TOO_HOT, {})])
def test_experts_are_listed_only_while_served(decision, listed):
    snap = NodeSnapshot(
        project="p" * 32, serving=True, decision=decision, experts={"ffn.0.1": 3}, peers=2
    )
    assert build_status(snap).experts == listed  # paused: withdrawn from the swarm
