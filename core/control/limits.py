"""What the node accepts, read off its own models: the defaults and ranges of every
numeric preference, the gap it keeps between a pause and a resume temperature, and the
format of a project id. The tray builds its forms from these (it imports this module)
and the control API serves the same object at ``/v1/limits``; a test compares the two."""

from __future__ import annotations

import re
import typing
from functools import cache
from typing import Annotated, Any, Final

import annotated_types
from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic.fields import FieldInfo

from core.control.preferences import Preferences

#: A project id: the first 32 hex digits of a hash of the owner's key and the project's
#: name (core/project/signed.py project_id). Pasted ids are lower-cased and stripped first
#: (people copy them from places that upper-case hex).
PROJECT_ID_PATTERN: Final = r"^[0-9a-f]{32}$"
_PROJECT_ID_RE: Final = re.compile(PROJECT_ID_PATTERN)
PROJECT_ID_RULE: Final = "a project id is 32 characters long, made of 0-9 and a-f"


def check_project_id(text: str) -> str:
    """``text`` when it is a project id; ValueError with the rule otherwise."""
    if not is_project_id(text):
        raise ValueError(f"{text[:80]!r}: {PROJECT_ID_RULE}")
    return text


def normalize_project_id(text: str) -> str:
    return text.strip().lower()


def is_project_id(text: str) -> bool:
    return bool(_PROJECT_ID_RE.match(text))


#: A project id in a request: the rule in the schema and in the error.
ProjectId = Annotated[
    str,
    AfterValidator(check_project_id),
    WithJsonSchema({"type": "string", "pattern": PROJECT_ID_PATTERN}),
]


class NumberRange(BaseModel):
    """``low`` .. ``high``; an open end (``low_open``) excludes the bound itself."""

    model_config = ConfigDict(frozen=True)
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    default: float | None = None

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


class PreferenceLimits(BaseModel):
    model_config = ConfigDict(frozen=True)
    #: Every preference's default, as JSON.
    defaults: dict[str, Any]
    #: Each numeric preference's range (a preference that may be null, like the memory
    #: cap, has the range of its number).
    ranges: dict[str, NumberRange]
    #: How far below a pause temperature the default resume temperature lies: the node
    #: requires resume < pause so the GPU does not flap around one limit.
    resume_gap_c: float
    project_id_pattern: str = PROJECT_ID_PATTERN


@cache
def preference_limits() -> PreferenceLimits:
    defaults = Preferences()
    ranges: dict[str, NumberRange] = {}
    for name, info in Preferences.model_fields.items():
        bounds = _number_bounds([*info.metadata, *_optional_metadata(info.annotation)])
        if bounds is not None:
            default = getattr(defaults, name)
            ranges[name] = bounds.model_copy(
                update={"default": float(default) if isinstance(default, int | float) else None}
            )
    return PreferenceLimits(
        defaults=defaults.model_dump(mode="json"),
        ranges=ranges,
        resume_gap_c=defaults.pause_above_c - defaults.resume_below_c,
    )


def _optional_metadata(annotation: Any) -> list[Any]:
    """The constraints of ``Annotated[float, Field(...)] | None`` (they sit inside the
    union, not on the field)."""
    found: list[Any] = []
    for arg in typing.get_args(annotation):
        for extra in getattr(arg, "__metadata__", ()):
            found.extend(extra.metadata if isinstance(extra, FieldInfo) else [extra])
    return found


def _number_bounds(metadata: list[Any]) -> NumberRange | None:
    """The range in a field's annotated-types metadata (``Field(ge=..., le=...)``)."""
    low, high, low_open, high_open = None, None, False, False
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = float(item.ge)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Gt):
            low, low_open = float(item.gt), True  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Le):
            high = float(item.le)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Lt):
            high, high_open = float(item.lt), True  # type: ignore[arg-type]
    if low is None or high is None:
        return None
    return NumberRange(low=low, high=high, low_open=low_open, high_open=high_open)
