"""Errors meant for the person at the keyboard: the CLI prints their message on one line
(no traceback) and exits with status 1. Light on purpose: the CLI imports it always."""


class UserFacingError(Exception):
    pass
