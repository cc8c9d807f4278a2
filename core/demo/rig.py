"""The dishonest volunteers of the demo and the tests, by name: ``moehome node --attack``
turns a name into the hooks the product offers (an answer hook, a gradient-sums hook)."""

from __future__ import annotations

from typing import Final

from core.contributing.sender import SumsHook
from core.demo.attacks import ATTACKS, Attack
from core.demo.cheats import ANSWER_CHEATS
from core.experts.answers import AnswerHook

#: Every name ``--attack`` takes: gradient attacks, then answer cheats.
KNOWN: Final = (*ATTACKS, *ANSWER_CHEATS)


def node_hooks(name: str | None) -> tuple[AnswerHook | None, SumsHook | None]:
    """(answer hook, sums hook) of the attack or cheat ``name`` (None: an honest node)."""
    if name is None:
        return None, None
    if name in ANSWER_CHEATS:
        return ANSWER_CHEATS[name], None
    if name in ATTACKS:
        return None, Attack(name)
    raise ValueError(f"unknown attack {name!r}; one of {', '.join(KNOWN)}")
