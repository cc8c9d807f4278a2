"""Tests in the network lab (net/testing/lab.py): namespaces, NAT routers, rate limits.

They need root and the ip/nft/tc commands. Elsewhere they are skipped, except where
MOEHOME_REQUIRE_LAB=1 (set by .ci/run, which installs what they need): there a missing
requirement fails them, so CI can never pass by skipping the NAT tests.
"""

from __future__ import annotations

import os

import pytest

from net.testing import lab_upnp
from net.testing.lab import missing_requirements


@pytest.fixture(autouse=True)
def _lab_requirements() -> None:
    require_lab()


def require_lab() -> None:
    """Skip (or, with MOEHOME_REQUIRE_LAB=1, fail) when the lab cannot run here; for
    module-scoped fixtures too, which run before the autouse check."""
    why_not = missing_requirements()
    if why_not is None:
        return
    if os.environ.get("MOEHOME_REQUIRE_LAB") == "1":
        pytest.fail(f"MOEHOME_REQUIRE_LAB=1 but {why_not}")
    pytest.skip(f"network lab unavailable: {why_not}")


def require_upnp() -> None:
    """The same for a home router that offers UPnP (miniupnpd)."""
    why_not = lab_upnp.missing()
    if why_not is None:
        return
    if os.environ.get("MOEHOME_REQUIRE_LAB") == "1":
        pytest.fail(f"MOEHOME_REQUIRE_LAB=1 but {why_not}")
    pytest.skip(f"no router with UPnP in the lab: {why_not}")
