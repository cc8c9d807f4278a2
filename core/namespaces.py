"""Every DHT namespace the program uses, with its rules: each peer built by core/ gets
this validator, so a record of any kind is checked the same way everywhere."""

from __future__ import annotations

from core.experts import records as expert_records
from core.project import records as project_records
from core.protocol.bans import BAN_NAMESPACE, BAN_RULE
from core.protocol.versions import VERSION_NAMESPACE, VERSION_RULE
from net import NamespacedValidator


def moehome_validator() -> NamespacedValidator:
    return NamespacedValidator().with_rules(
        {
            expert_records.NAMESPACE: expert_records.RULE,
            VERSION_NAMESPACE: VERSION_RULE,
            BAN_NAMESPACE: BAN_RULE,
            **project_records.RULES,
        }
    )
