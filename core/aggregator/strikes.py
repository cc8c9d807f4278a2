"""Strikes and bans of contributors at an aggregator: ``max_invalid`` invalid
contributions within ``window`` seconds ban a contributor for ``ban_seconds``; a project
ban (core/project/bans.py) refuses it for good. Identities are free to make, so what is
remembered is bounded: the oldest strikes and bans are forgotten first."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

#: Identities whose strikes and bans are remembered (the oldest are forgotten).
MAX_TRACKED: Final = 10_000


class Strikes:
    def __init__(self, *, max_invalid: int, window: float, ban_seconds: float) -> None:
        self.max_invalid, self.window, self.ban_seconds = max_invalid, window, ban_seconds
        # per contributor (hex public key): times of its recent strikes, most recent last
        self.invalid: OrderedDict[str, list[float]] = OrderedDict()
        self.banned_until: OrderedDict[str, float] = OrderedDict()
        #: contributors a project ban names: refused, not struck
        self.project_banned: set[str] = set()

    def ban_left(self, who: str, now: float) -> float:
        """Seconds left of ``who``'s ban (0: none)."""
        return max(0.0, self.banned_until.get(who, 0.0) - now)

    def strike(self, who: str, now: float) -> int:
        """Count an invalid contribution of ``who``; returns its strikes when they just
        banned it (0 otherwise)."""
        strikes = [t for t in self.invalid.pop(who, []) if t > now - self.window] + [now]
        self.invalid[who] = strikes
        while len(self.invalid) > MAX_TRACKED:  # throwaway identities: the oldest go
            self.invalid.popitem(last=False)
        if len(strikes) < self.max_invalid:
            return 0
        self.banned_until[who] = now + self.ban_seconds
        self.banned_until.move_to_end(who)
        while len(self.banned_until) > MAX_TRACKED:
            self.banned_until.popitem(last=False)
        del self.invalid[who]
        return len(strikes)

    def save(self) -> dict[str, Any]:
        """Plain data for the aggregator's state file (bans outlive a restart)."""
        return {
            "invalid": [[w, t] for w, t in self.invalid.items()],
            "banned_until": [[w, t] for w, t in self.banned_until.items()],
            "project_banned": sorted(self.project_banned),
        }

    def load(self, data: dict[str, Any]) -> None:
        self.invalid = OrderedDict(
            (str(w), [float(x) for x in t]) for w, t in data.get("invalid", [])
        )
        self.banned_until = OrderedDict((str(w), float(t)) for w, t in data.get("banned_until", []))
        self.project_banned = {str(w) for w in data.get("project_banned", [])}

    def prune(self, now: float) -> None:
        """Forget strikes and bans that ended."""
        for who in [w for w, t in self.banned_until.items() if t <= now]:
            del self.banned_until[who]
        for who in [w for w, s in self.invalid.items() if s[-1] <= now - self.window]:
            del self.invalid[who]
