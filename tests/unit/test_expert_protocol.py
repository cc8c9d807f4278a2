"""The expert protocol's typed requests and answers (core/protocol/expert_methods.py):
what one end writes, the other reads back; a request of the wrong types is refused
whole, an answer of the wrong types reads as absent."""

from __future__ import annotations

import math

import pytest

from core.protocol.expert_methods import (
    BACKWARD,
    FORWARD,
    INFO,
    Backlog,
    ExpertAnswer,
    ExpertInfo,
    ExpertRequest,
    RequestError,
)


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        (FORWARD, ExpertRequest("ffn.0.1")),
        (FORWARD, ExpertRequest("ffn.0.1", ("q4",), "q3", keep=True)),
        (BACKWARD, ExpertRequest("ffn.0.1", ("q4", "raw"), receipt=b"r")),
        (BACKWARD, ExpertRequest("ffn.0.1", ("q4",), "q4", handle=7, receipt=b"r")),
        (BACKWARD, ExpertRequest("ffn.0.1", recompute=True)),
        (INFO, ExpertRequest("ffn.0.1")),
    ],
)
def test_a_request_reads_back_as_it_was_written(method, request_):
    assert ExpertRequest.parse(method, request_.to_meta()) == request_


def test_a_plain_request_is_its_uid_alone_on_the_wire():
    assert ExpertRequest("ffn.0.1").to_meta() == {"uid": "ffn.0.1"}


@pytest.mark.parametrize(
    ("method", "meta", "words"),
    [
        (FORWARD, {"uid": 5}, "not served here"),
        (FORWARD, {}, "not served here"),
        (BACKWARD, {"uid": "e", "handle": "1"}, "handle must be an integer"),
        (BACKWARD, {"uid": "e", "handle": True}, "handle must be an integer"),
        (FORWARD, {"uid": "e", "codecs": "q4"}, "codecs must name 1"),
        (FORWARD, {"uid": "e", "codecs": ["q4", "q4"]}, "codecs must name 1"),
        (BACKWARD, {"uid": "e", "codecs": ["q4"]}, "codecs must name 2"),
        (BACKWARD, {"uid": "e", "handle": 3, "codecs": ["q4", "q4"]}, "codecs must name 1"),
        (FORWARD, {"uid": "e", "codecs": [4]}, "codecs must name 1"),
        (FORWARD, {"uid": "e", "answer": 3}, "answer must name a codec"),
    ],
)
def test_a_request_of_the_wrong_types_is_refused_naming_the_field(method, meta, words):
    with pytest.raises(RequestError, match=words):
        ExpertRequest.parse(method, meta)


def test_flags_of_any_other_value_than_true_are_off():
    request = ExpertRequest.parse(
        FORWARD, {"uid": "e", "keep": 1, "recompute": "yes", "receipt": "not bytes"}
    )
    assert (request.keep, request.recompute, request.receipt) == (False, False, None)


def test_an_answer_reads_back_as_it_was_written():
    answer = ExpertAnswer(
        3, "ab" * 32, Backlog(2.0, 40.0), "q4", 0.01, b"statement", handle=9, gradient=True
    )
    assert ExpertAnswer.read(answer.to_meta()) == answer


@pytest.mark.parametrize(
    ("meta", "read"),
    [
        ({}, ExpertAnswer(0, None, Backlog())),
        (
            {"version": True, "sha256": 5, "queue": math.inf, "rate": "fast", "seconds": -1},
            ExpertAnswer(0, None, Backlog(), seconds=-1.0),
        ),
        ({"handle": 1.5, "gradient": 1, "statement": "text"}, ExpertAnswer(0, None, Backlog())),
        ({"codec": ["q4"]}, ExpertAnswer(0, None, Backlog(), codec="['q4']")),
    ],
)
def test_an_answer_of_the_wrong_types_reads_as_absent(meta, read):
    assert ExpertAnswer.read(meta) == read


def test_info_carries_the_backlog_beside_its_fields():
    info = ExpertInfo("ffn.0.1", {"kind": "ffn"}, 2, "cd" * 32, 64, 0.5, Backlog(1.0))
    assert info.to_meta() == {
        "version": 2,
        "sha256": "cd" * 32,
        "queue": 1.0,
        "uid": "ffn.0.1",
        "spec": {"kind": "ffn"},
        "max_batch": 64,
        "load": 0.5,
    }
