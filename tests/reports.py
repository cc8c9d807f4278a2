"""An aggregator's agg.stats reply read in tests: its signed account, checked against the
key it names (a test that knows the aggregator's key checks that too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.protocol.signed_report import SignedReport


def stats_of(meta: Mapping[str, Any], key: bytes | None = None) -> dict[str, Any]:
    """The account in an agg.stats reply, as a dict; asserts its signature."""
    signed = SignedReport.decode(meta["signed"])
    assert signed.verify(), "an aggregator's account must verify with its own key"
    assert key is None or signed.aggregator == key
    return signed.report().model_dump()
