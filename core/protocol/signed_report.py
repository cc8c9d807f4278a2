"""An aggregator's account (agg.stats, core/protocol/aggregator_methods.py) signed by its
key: ``moehome owner status`` and the project page (core/project/page.py) show only
figures a key of the manifest signed, and a page's reader can check them on any
machine.

agg.stats  meta {} -> meta {signed: SignedReport}
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from core.protocol.aggregator_methods import AggregatorReport
from core.protocol.fields import MessageError, nonnegative_float, unpack_message
from core.protocol.fields import exact_bytes as _bytes
from core.protocol.fields import short_str as _str
from net.codec import pack
from net.identity import Identity, verify_signature

_DOMAIN: Final = "moehome-aggregator-report/1"
#: a signed report travels in an RPC header (at most 64 KiB)
MAX_REPORT_BYTES: Final = 60 * 1024


@dataclass(frozen=True)
class SignedReport:
    project: str
    aggregator: bytes
    #: when the aggregator stated it (unix seconds)
    issued: float
    #: the report, as msgpack of ``AggregatorReport.model_dump()``
    body: bytes
    signature: bytes = b""

    def payload(self) -> bytes:
        return pack([_DOMAIN, self.project, self.aggregator, self.issued, self.body])

    @classmethod
    def sign(
        cls, aggregator: Identity, project: str, report: AggregatorReport, issued: float
    ) -> SignedReport:
        unsigned = cls(project, aggregator.public_key, float(issued), pack(report.model_dump()))
        return replace(unsigned, signature=aggregator.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.aggregator, self.payload(), self.signature)

    def report(self) -> AggregatorReport:
        """The report it signs; ValueError (pydantic's ValidationError is one) when its
        body is no report."""
        return AggregatorReport.model_validate(
            unpack_message(self.body, MAX_REPORT_BYTES, "a report (the signed body)")
        )

    def encode(self) -> bytes:
        return pack([self.project, self.aggregator, self.issued, self.body, self.signature])

    @classmethod
    def decode(cls, data: Any) -> SignedReport:
        if not isinstance(data, bytes) or len(data) > MAX_REPORT_BYTES:
            raise MessageError(f"a signed report is bytes, at most {MAX_REPORT_BYTES}")
        obj = unpack_message(data, MAX_REPORT_BYTES, "a signed report")
        if not isinstance(obj, list) or len(obj) != 5:
            raise MessageError("a signed report is a list of 5 fields")
        if not isinstance(obj[3], bytes):
            raise MessageError("the report's body must be bytes")
        return cls(
            _str(obj[0], "project"),
            _bytes(obj[1], 32, "aggregator"),
            nonnegative_float(obj[2], "issued"),
            obj[3],
            _bytes(obj[4], 64, "signature"),
        )
