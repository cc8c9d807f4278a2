"""The volunteer's preferences: safe defaults (BOINC's: GPU only after 3 idle minutes),
validated with errors that name the field, saved in the user's config folder.

The one source of the rules: the node validates with this model, the control API serves
it (and its ranges, :mod:`core.control.limits`), the tray builds its forms from it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.files import replace_file

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
HHMM = Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]


class PreferencesError(ValueError):
    """Invalid preferences; ``problems`` lists them as 'field: message'."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class Window(BaseModel):
    """Work is allowed on ``days`` from ``start`` to ``end`` (end < start spans midnight)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    days: Annotated[list[Day], Field(min_length=1)] = list(_DAYS)
    start: HHMM = "00:00"
    end: HHMM = "23:59"

    def allows(self, now: dt.datetime) -> bool:
        minutes = now.hour * 60 + now.minute
        start = int(self.start[:2]) * 60 + int(self.start[3:])
        end = int(self.end[:2]) * 60 + int(self.end[3:])
        day = _DAYS[now.weekday()]
        if start <= end:
            return day in self.days and start <= minutes <= end
        # spans midnight: the part after midnight belongs to the previous day's window
        yesterday = _DAYS[(now.weekday() - 1) % 7]
        return (day in self.days and minutes >= start) or (
            yesterday in self.days and minutes <= end
        )


class Preferences(BaseModel):
    # strict: "yes" or 1 is no boolean, "3" no number (a typo must not pass as a choice)
    model_config = ConfigDict(extra="forbid", frozen=True, validate_assignment=True, strict=True)

    idle_only: bool = True
    idle_minutes: Annotated[float, Field(ge=0, le=24 * 60)] = 3.0
    pause_above_c: Annotated[float, Field(ge=40, le=110)] = 83.0
    resume_below_c: Annotated[float, Field(ge=30, le=105)] = 75.0
    cpu_pause_above_c: Annotated[float, Field(ge=40, le=110)] = 90.0
    cpu_resume_below_c: Annotated[float, Field(ge=30, le=105)] = 80.0
    duty_cycle: Annotated[float, Field(gt=0, le=1)] = 1.0
    schedule: Annotated[list[Window], Field(max_length=28)] = []  # empty: any time
    pause_on_battery: bool = True
    exclusive_apps: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=100)]], Field(max_length=200)
    ] = []
    gpus: (
        Annotated[list[Annotated[int, Field(ge=0, le=63)]], Field(max_length=64)] | Literal["all"]
    ) = "all"
    memory_cap_gb: Annotated[float, Field(gt=0, le=4096)] | None = None
    #: Processor threads the node computes with; None: as many as torch picks (the cores).
    #: What a volunteer without a GPU turns down to keep the computer responsive.
    cpu_threads: Annotated[int, Field(ge=1, le=256)] | None = None
    #: Let other computers reach this node (it listens on every network interface):
    #: what serving needs. Off: only this computer can (the node works for local tests).
    #: Read when the node starts. The control API listens on 127.0.0.1 either way.
    listen_on_network: bool = True
    #: Relay for volunteers behind NAT while this computer is reachable directly: each
    #: connection it carries is bounded in time and bytes (net/reach/relay.py). Read when the
    #: node starts.
    relay_for_others: bool = False
    #: Ask the home router to forward the node's port (UPnP IGD; net/reach/portmap.py), so
    #: that peers reach it directly instead of through a relay. Off by default: it opens
    #: a port on the volunteer's router. Read when the node starts.
    map_port: bool = False

    @model_validator(mode="after")
    def _hysteresis(self) -> Preferences:
        if self.resume_below_c >= self.pause_above_c:
            raise ValueError(
                f"resume_below_c ({self.resume_below_c}) must be below "
                f"pause_above_c ({self.pause_above_c})"
            )
        if self.cpu_resume_below_c >= self.cpu_pause_above_c:
            raise ValueError("cpu_resume_below_c must be below cpu_pause_above_c")
        return self

    def schedule_allows(self, now: dt.datetime) -> bool:
        return not self.schedule or any(w.allows(now) for w in self.schedule)

    def updated(self, changes: dict[str, Any]) -> Preferences:
        """A copy with ``changes`` applied, validated as a whole."""
        return parse_preferences({**self.model_dump(), **changes})


def parse_preferences(data: Any) -> Preferences:
    try:
        return Preferences.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if not loc:  # a check across fields: it names the field to change first
                first = msg.split(" ", 1)[0]
                loc = first if first in Preferences.model_fields else "preferences"
            if e["type"] == "extra_forbidden":
                msg = "unknown preference"
            problems.append(f"{loc}: {msg}")
        raise PreferencesError(problems) from None


def load_preferences(path: Path) -> Preferences:
    """The saved preferences, or the defaults when there are none."""
    if not path.exists():
        return Preferences()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PreferencesError([f"{path}: cannot read ({exc})"]) from exc
    return parse_preferences(data)


def save_preferences(prefs: Preferences, path: Path) -> None:
    replace_file(path, prefs.model_dump_json(indent=2))
