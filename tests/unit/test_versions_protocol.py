"""The versions request and answer (core/protocol/versions.py): what is refused, and that
an answer is bounded before it is decoded."""

from __future__ import annotations

import pytest

from core.protocol.fields import MessageError
from core.protocol.versions import (
    MAX_UIDS_PER_ASK,
    MAX_VERSION_BYTES,
    parse_versions_answer,
    parse_versions_ask,
    versions_answer,
    versions_ask,
)
from net.codec import pack

PROJECT = "0123456789abcdef0123456789abcdef"


def test_a_request_reads_back_as_it_was_made():
    assert parse_versions_ask(versions_ask(PROJECT, ["a", "b"])) == (PROJECT, ["a", "b"])


def test_no_request_names_more_experts_than_an_aggregator_reads():
    with pytest.raises(ValueError, match="at most"):
        versions_ask(PROJECT, ["a"] * (MAX_UIDS_PER_ASK + 1))


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({}, "names a project"),
        ({"project": PROJECT, "uids": ("a",)}, "names a project"),  # not a list
        ({"project": PROJECT, "uids": ["a"] * (MAX_UIDS_PER_ASK + 1)}, "at most"),
        ({"project": PROJECT, "uids": [b"a"]}, "strings"),
        ({"project": PROJECT, "uids": ["a" * 129]}, "strings"),
    ],
)
def test_malformed_requests_are_refused(meta, why):
    with pytest.raises(MessageError, match=why):
        parse_versions_ask(meta)


def test_an_answer_keeps_the_records_of_the_experts_asked_only():
    blob = versions_answer({"a": b"record a", "b": b"record b", "z": b"not asked"})
    assert parse_versions_answer(blob, ["a", "b", "c"]) == {"a": b"record a", "b": b"record b"}


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (pack({"a": b"x" * (MAX_VERSION_BYTES + 1)}), "at most|maps"),  # a record too long
        (pack({"a": "text"}), "maps experts to records"),
        (pack(["a"]), "maps experts to records"),
        (b"\xc1", "not msgpack"),
        # more bytes than the experts asked can hold: refused before it is decoded
        (b"\x00" * (2 * (MAX_VERSION_BYTES + 200)), "bytes"),
    ],
)
def test_malformed_answers_are_refused(blob, why):
    with pytest.raises(MessageError, match=why):
        parse_versions_answer(blob, ["a"])
