"""Errors meant for the person at the keyboard: the CLI prints their message on one line
(no traceback) and exits with status 1. Light on purpose: the CLI imports it always."""


class UserFacingError(Exception):
    pass


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaf_exceptions(sub)]
    return [exc]


def one_line(exc: BaseException) -> str:
    """What went wrong, on one line, looking through trio's exception groups."""
    return "; ".join(str(e) or type(e).__name__ for e in leaf_exceptions(exc))
