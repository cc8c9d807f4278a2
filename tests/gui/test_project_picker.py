"""Choosing a project in the wizard and in Project…: an invite is looked up by the node
before anyone says yes, what it is gets shown, a project that is not found is never
joined, and errors sit under the field in words a volunteer can act on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.background import run_now
from app.project_picker import ProjectPicker, count, summary_text
from app.wizard import FirstStartWizard, WizardActions
from core.control import ControlError, NodeNotRunning
from core.control.invite import Invite
from core.control.models import ProjectSummary

PROJECT = "0123456789abcdef" * 2
OTHER = "f" * 32
PEER = "/ip4/198.18.0.7/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
INVITE = Invite(project=PROJECT, peers=(PEER,))
SUMMARY = ProjectSummary(
    project=PROJECT,
    name="tiny-lm",
    description="a small language model",
    owner="1a2b-3c4d-5e6f-7a8b",
    experts=32,
    mixture_layers=2,
    expert_kind="ffn",
    expert_parameters=16_640,
)


class FakeNode:
    """The node's side of the wizard: finds what it knows, joins, leaves; records calls."""

    def __init__(self) -> None:
        self.known = {PROJECT: SUMMARY}
        self.announced: list[ProjectSummary] = []
        self.list_error: Exception | None = None
        self.join_problems: list[str] = []
        self.found: list[Invite] = []
        self.joined: list[Invite] = []
        self.left = 0

    def list_projects(self) -> list[ProjectSummary]:
        if self.list_error is not None:
            raise self.list_error
        return self.announced

    def find(self, invite: Invite) -> ProjectSummary:
        self.found.append(invite)
        if invite.project not in self.known:
            raise ControlError(
                "none of the 1 peer(s) in the invite answered: they may have gone, or this "
                "computer cannot reach them"
            )
        return self.known[invite.project]

    def join(self, invite: Invite) -> list[str]:
        self.joined.append(invite)
        return self.join_problems

    def leave(self) -> list[str]:
        self.left += 1
        return []

    def actions(self, run: Any = run_now) -> WizardActions:
        return WizardActions(
            list_projects=self.list_projects,
            find=self.find,
            join=self.join,
            leave=self.leave,
            start_benchmark=lambda: None,
            apply_limits=lambda changes: [],
            run=run,
        )


class LaterRunner:
    """Holds each command until the test lets it finish (a node that takes its time)."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def __call__(self, work: Any, on_result: Any, on_error: Any) -> None:
        self.waiting.append(lambda: run_now(work, on_result, on_error))

    def finish_all(self) -> None:
        while self.waiting:
            self.waiting.pop(0)()


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def wizard(qtbot: Any, node: FakeNode) -> FirstStartWizard:
    w = FirstStartWizard(node.actions())
    qtbot.addWidget(w)
    w.show()
    w.next()  # to the project page
    assert w.currentPage() is w.project_page
    return w


def test_a_pasted_invite_is_looked_up_and_shown_before_joining(wizard, node):
    page = wizard.project_page
    assert not page.isComplete()
    page.picker.invite_edit.setText(INVITE.link())
    assert node.found == [INVITE]  # through the invite's peers
    assert node.joined == []  # looking is not joining
    shown = page.picker.summary.text()
    for words in ("tiny-lm", "a small language model", "1a2b-3c4d-5e6f-7a8b", PROJECT):
        assert words in shown
    assert "Trains: 32 feed-forward experts in 2 layers, 16.6 k parameters each" in shown
    assert page.isComplete()
    wizard.next()
    assert node.joined == [INVITE]
    assert wizard.currentPage() is wizard.benchmark_page


def test_a_project_that_is_not_found_is_never_joined(wizard, node):
    page = wizard.project_page
    page.picker.invite_edit.setText(Invite(project=OTHER, peers=(PEER,)).link())
    error = page.picker.invite_error
    assert error.isVisible()
    assert error.text().startswith("None of the 1 peer(s) in the invite answered")
    assert not page.isComplete()
    assert not page.picker.summary.isVisible()
    wizard.next()
    assert node.joined == []
    assert wizard.currentPage() is page
    # a second look (the owner's peer is back) finds it; the message goes
    node.known[OTHER] = ProjectSummary(project=OTHER, name="other")
    page.picker.look_up_button.click()
    assert not error.isVisible()
    assert page.isComplete()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("hello", "Is neither an invite nor a project id"),
        (PROJECT[:-1], "Is neither an invite nor a project id"),
        ("https://example.org/join", "Is not a moehome invite"),
        (f"moehome://join/{PROJECT}?peer=%2Fip4%2F1.2.3.4%2Ftcp%2F1", "Bad peer"),
    ],
)
def test_what_is_no_invite_is_said_under_the_field_and_cleared_when_fixed(wizard, node, text, says):
    picker = wizard.project_page.picker
    picker.invite_edit.setText(text)
    assert picker.invite_error.isVisible()
    assert says.lower() in picker.invite_error.text().lower()
    assert not picker.look_up_button.isEnabled()
    assert node.found == []  # the node is not asked about nonsense
    picker.invite_edit.setText(PROJECT)
    assert not picker.invite_error.isVisible()
    assert node.found == [Invite(project=PROJECT)]


def test_picking_an_announced_project_shows_it_at_once(wizard, node):
    node.announced = [
        ProjectSummary(project=OTHER, name="alpha", description="first"),
        SUMMARY,
    ]
    page = wizard.project_page
    page.picker.refresh()
    assert page.picker.project_list.count() == 2
    assert not page.isComplete()  # focus alone chooses nothing
    page.picker.project_list.setCurrentRow(1)
    assert page.picker.invite_edit.text() == PROJECT
    assert "tiny-lm" in page.picker.summary.text()
    assert node.found == []  # the list's entries were verified when listed
    wizard.next()
    assert node.joined == [Invite(project=PROJECT)]


def test_join_problems_keep_the_page_and_show_the_nodes_words(wizard, node):
    node.join_problems = ["the project's weights do not match its manifest"]
    page = wizard.project_page
    page.picker.invite_edit.setText(PROJECT)
    wizard.next()
    assert wizard.currentPage() is page
    assert page.error.isVisible()
    assert page.error.text() == node.join_problems[0]


def test_skip_after_joining_leaves_the_project_again(wizard, node):
    page = wizard.project_page
    page.picker.invite_edit.setText(PROJECT)
    wizard.next()
    assert wizard.currentPage() is wizard.benchmark_page
    wizard.back()
    page.skip_check.setChecked(True)
    assert not page.picker.isEnabled()
    wizard.next()
    assert node.left == 1
    assert page.joined is None
    assert wizard.currentPage() is wizard.benchmark_page


def test_skip_without_a_project_leaves_nothing(wizard, node):
    wizard.project_page.skip_check.setChecked(True)
    assert wizard.project_page.isComplete()
    wizard.next()
    assert node.joined == []
    assert node.left == 0


def test_listing_failure_is_shown_and_pasting_still_works(wizard, node):
    node.list_error = ControlError("the node does not answer")
    picker = wizard.project_page.picker
    picker.refresh()
    assert "Could not list the projects: the node does not answer" in picker.list_status.text()
    assert picker.refresh_button.isEnabled()
    picker.invite_edit.setText(PROJECT)
    assert wizard.project_page.isComplete()


def test_a_slow_node_keeps_the_window_alive_and_moves_on_when_joined(qtbot, node):
    later = LaterRunner()
    wizard = FirstStartWizard(node.actions(run=later))
    qtbot.addWidget(wizard)
    wizard.show()
    wizard.next()
    page = wizard.project_page
    page.picker.invite_edit.setText(INVITE.link())
    assert "Looking for the project" in page.picker.summary.text()
    assert not page.isComplete()
    later.finish_all()
    assert page.isComplete()
    wizard.next()  # the join goes to the background; the page says so and waits
    assert wizard.currentPage() is page
    assert page.joining.isVisible()
    assert "Joining tiny-lm" in page.joining.text()
    assert not page.isComplete()  # no second click while it joins
    later.finish_all()
    assert node.joined == [INVITE]
    assert wizard.currentPage() is wizard.benchmark_page


def test_an_answer_to_an_earlier_look_up_does_not_count(qtbot, node):
    later = LaterRunner()
    picker = ProjectPicker(node.list_projects, node.find, later)
    qtbot.addWidget(picker)
    picker.show()
    picker.invite_edit.setText(PROJECT)  # looked up ...
    picker.invite_edit.setText(OTHER)  # ... then the volunteer pastes another
    later.finish_all()
    assert picker.chosen is None  # PROJECT's answer came, but OTHER is asked about
    assert picker.invite_error.isVisible()


@pytest.mark.parametrize(
    ("n", "text"), [(42, "42"), (16_640, "16.6 k"), (1_000_000, "1 M"), (2.5e9, "2.5 G")]
)
def test_counts_read_well(n, text):
    assert count(n) == text


@pytest.mark.parametrize(
    ("kind", "words"), [("ffn", "feed-forward"), ("swiglu", "SwiGLU (Mixtral-style)")]
)
def test_a_summary_names_each_expert_kind_in_words(kind, words):
    summary = SUMMARY.model_copy(update={"expert_kind": kind})
    assert f"Trains: 32 {words} experts in 2 layers" in summary_text(summary)


def test_a_summary_of_a_bare_manifest_still_names_the_project():
    assert summary_text(ProjectSummary(project=PROJECT)) == f"{PROJECT}\nProject id: {PROJECT}"


def test_a_node_that_is_not_up_yet_is_said_in_words(wizard, node):
    node.list_error = NodeNotRunning("no node is running for /home/x/.local/share/moehome")
    picker = wizard.project_page.picker
    picker.refresh()
    assert "node is not running yet" in picker.list_status.text()
    assert "/home/x" not in picker.list_status.text()


def test_an_invite_from_a_link_is_looked_up_only_after_a_click(wizard, node):
    """Issue 35, finding 2: a `moehome://` link opened from a web page was looked up at
    once, so that a page could make the node dial what its invite names (and feed it a
    manifest) without the volunteer doing anything."""
    picker = wizard.project_page.picker
    picker.set_invite_text(INVITE.link())
    assert node.found == []
    assert "Look up asks the 1 peer it names" in picker.summary.text()
    assert picker.look_up_button.isEnabled()
    assert not wizard.project_page.isComplete()
    picker.look_up_button.click()
    assert node.found == [INVITE]
    assert "tiny-lm" in picker.summary.text()
    assert wizard.project_page.isComplete()
    picker.set_invite_text("moehome://join/nope")  # what is no invite: said, never sent
    assert node.found == [INVITE]
    assert picker.invite_error.isVisible()
    assert not picker.look_up_button.isEnabled()


def test_the_whole_summary_shows_on_first_view(wizard, node, qtbot):
    """Three of three fresh users saw the summary cut off: the owner's key and the
    project id hidden under the list, no scroll bar."""
    picker = wizard.project_page.picker
    picker.invite_edit.setText(INVITE.link())
    summary = picker.summary
    qtbot.waitUntil(summary.isVisible, timeout=2000)
    qtbot.wait(50)  # the layout settles
    assert summary.height() >= summary.heightForWidth(summary.width())
    bottom = summary.mapTo(wizard, summary.rect().bottomLeft()).y()
    assert bottom <= wizard.height()


def test_the_list_is_asked_again_once_an_invite_brought_the_node_its_first_peers(wizard, node):
    """The list was asked before the node knew any peer, and stayed empty after the
    invite's peers had shown it the swarm."""
    picker = wizard.project_page.picker
    assert picker.project_list.count() == 0
    node.announced = [SUMMARY]  # what the swarm announces, seen through the invite's peers
    picker.invite_edit.setText(INVITE.link())
    assert picker.project_list.count() == 1
    assert "tiny-lm" in picker.project_list.item(0).text()
