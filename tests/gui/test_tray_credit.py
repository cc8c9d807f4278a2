"""The tray shows the credit the project's aggregators signed for this node, once they
did. No node: the test feeds the tray statuses."""

from __future__ import annotations

import pytest

from app.tray import credit_line
from core.control.models import Credit, Status
from tests.gui.test_tray_device import make_tray


def status(credit: Credit) -> Status:
    return Status(state="working", reason="", experts={"a": 0}, credit=credit, pid=5)


@pytest.mark.parametrize(
    ("credit", "line"),
    [
        (Credit(), ""),  # not asked yet
        (
            Credit(total=1234.4, today=56.6, aggregators=2, aggregators_listed=2, checked_at=1.0),
            "Credit: 57 today, 1,234 in all",
        ),
        (
            Credit(total=10, today=0, aggregators=1, aggregators_listed=3, checked_at=1.0),
            "Credit: 0 today, 10 in all (1 of 3 aggregators answered)",
        ),
        (
            Credit(
                total=10,
                today=4,
                aggregators=1,
                aggregators_listed=1,
                checked_at=1.0,
                rank=3,
                ranked=17,
            ),
            "Credit: 4 today, 10 in all, #3 of 17",
        ),
    ],
)
def test_the_credit_line(credit, line):
    assert credit_line(status(credit)) == line
    assert credit_line(None) == ""


def test_the_tray_shows_the_credit_once_the_aggregators_signed_it(qtbot, tmp_path):
    tray = make_tray(tmp_path)
    action = tray.find_action("creditAction")
    with qtbot.waitSignal(tray.shown):
        tray._on_status(status(Credit()))
    assert not action.isVisible()
    signed = Credit(
        total=20, today=5, aggregators=1, aggregators_listed=1, checked_at=1.0, proof="/p.proof"
    )
    with qtbot.waitSignal(tray.shown):
        tray._on_status(status(signed))
    assert action.isVisible()
    assert action.text() == "Credit: 5 today, 20 in all"
    assert "/p.proof" in action.toolTip()
