"""Pure parts of net/: rate limiter, routing table, record store, record validator."""

from __future__ import annotations

import pytest

from net.codec import pack
from net.dht.records import (
    MAX_PEER_ADDRS,
    NamespacedValidator,
    NamespaceRule,
    RecordRejected,
    SignedRecord,
    decode_peer_addrs,
    encode_peer_addrs,
    peer_record_key,
    sign_record,
)
from net.dht.routing import RoutingTable, key_id_of
from net.dht.store import RecordStore, StoreLimits
from net.identity import Identity
from net.ratelimit import Admission, FairRate, PeerRateLimiter, RateLimits, TokenBucket

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([(0.0, 1), (0.0, 1), (0.0, 1)], [True, True, False]),  # burst of 2
        ([(0.0, 2), (0.5, 1), (1.0, 1)], [True, True, True]),  # 2 tokens/s refill
        ([(0.0, 2), (0.1, 1)], [True, False]),
        ([(0.0, 3)], [False]),  # never more than the burst
    ],
)
def test_token_bucket(events, expected):
    bucket = TokenBucket.full(rate=2.0, burst=2.0, now=0.0)
    assert [bucket.try_take(amount, now) for now, amount in events] == expected


def test_rate_limiter_counts_requests_and_bytes_per_peer():
    limiter: PeerRateLimiter[str] = PeerRateLimiter(
        RateLimits(
            requests_per_second=1, request_burst=2, bytes_per_second=10, byte_burst=100, max_peers=2
        )
    )
    assert limiter.admit("a", 60, 0.0) is Admission.ADMIT
    assert limiter.admit("a", 60, 0.0) is Admission.TOO_MANY_BYTES
    assert limiter.admit("a", 0, 0.0) is Admission.TOO_MANY_REQUESTS
    assert limiter.admit("b", 0, 0.0) is Admission.ADMIT  # other peers unaffected
    assert limiter.admit("c", 0, 0.0) is Admission.ADMIT
    assert limiter.admit("a", 0, 0.0) is Admission.ADMIT  # forgotten (max_peers=2): fresh bucket


def test_routing_table_keeps_old_contacts_when_a_bucket_is_full_and_promotes_replacements():
    table: RoutingTable[int] = RoutingTable(self_id=0, k=2, max_failures=1)
    # ids 4..7 share the bucket of bit length 3
    for peer in (4, 5, 6):
        table.add(peer, peer, ["/ip4/127.0.0.1/tcp/1"], now=float(peer))
    assert {c.peer for c in table.contacts()} == {4, 5}
    table.mark_failed(4)
    assert {c.peer for c in table.contacts()} == {5, 6}
    assert [c.peer for c in table.closest(7, 5)] == [6, 5]  # xor distance 1, then 2
    assert table.add(0, 0, [], 0.0) is False  # never ourselves


def test_routing_table_closest_is_sorted_by_xor_distance():
    table: RoutingTable[int] = RoutingTable(self_id=1 << 255, k=20)
    for peer in range(1, 200):
        table.add(peer, peer * 7919, [], 0.0)
    target = key_id_of("/moehome/demo/x")
    closest = table.closest(target, 10)
    distances = [c.node_id ^ target for c in closest]
    assert distances == sorted(distances)


def record(
    identity: Identity, key="/moehome/demo/k", value=b"v", ttl=60.0, now=NOW
) -> SignedRecord:
    return sign_record(identity, key, value, ttl, now)


def test_store_keeps_the_newest_record_per_author():
    a = Identity.generate()
    store = RecordStore()
    assert store.put(record(a, value=b"1", now=NOW), NOW)
    assert store.put(record(a, value=b"2", now=NOW + 1), NOW)
    assert not store.put(record(a, value=b"old", now=NOW - 5), NOW)
    assert [r.value for r in store.get("/moehome/demo/k", NOW)] == [b"2"]
    assert store.get("/moehome/demo/k", NOW + 70_000) == []
    assert len(store) == 0  # expired records found by a get are dropped
    assert store.put(record(a, ttl=1), NOW)
    assert store.sweep(NOW + 2_000) == 1
    assert store.weight == 0


def test_a_crowd_under_one_key_loses_its_own_oldest_and_long_lifetimes_buy_nothing():
    honest = Identity.generate()
    store = RecordStore(StoreLimits(max_authors_per_key=4, max_authors_per_source=3))
    assert store.put(record(honest, ttl=30), NOW, source="198.18.0.1")
    crowd = [Identity.generate() for _ in range(10)]
    for who in crowd:  # long-lived records from one address
        store.put(record(who, ttl=3600), NOW, source="198.18.9.9")
    authors = {r.author for r in store.get("/moehome/demo/k", NOW)}
    assert honest.public_key in authors
    assert authors - {honest.public_key} == {who.public_key for who in crowd[-3:]}
    assert store.stats.evicted["key_source"] == 7
    # a second address fills the key: the heaviest address (the crowd) makes room
    store.put(record(Identity.generate()), NOW, source="198.18.0.2")
    assert len(store.get("/moehome/demo/k", NOW)) == 4
    assert honest.public_key in {r.author for r in store.get("/moehome/demo/k", NOW)}
    store.put(record(Identity.generate()), NOW, source="198.18.0.3")
    assert honest.public_key in {r.author for r in store.get("/moehome/demo/k", NOW)}
    assert store.stats.evicted["key"] == 2


def test_one_address_cannot_fill_the_store_and_new_keys_from_others_still_get_in():
    """The red-team pass filled a store with 100,000 tiny records from one peer: every
    new key was refused for an hour."""
    limits = StoreLimits(max_weight=100 * 700, source_share=1 / 4)
    store = RecordStore(limits)
    spammer = Identity.generate()
    for i in range(200):
        store.put(record(spammer, key=f"/moehome/demo/spam{i}"), NOW, source="198.18.9.9")
    assert store.weight_from("198.18.9.9") <= limits.max_weight / 4
    assert store.stats.evicted["source"] > 0
    honest = Identity.generate()
    for i in range(20):
        assert store.put(record(honest, key=f"/moehome/demo/new{i}"), NOW, source="198.18.0.1")
    assert len(store.get("/moehome/demo/new0", NOW)) == 1


def test_when_the_store_is_full_the_heaviest_address_makes_room():
    limits = StoreLimits(max_weight=40 * 700, source_share=1.0)
    store = RecordStore(limits, namespace_share=lambda namespace: 2.0)
    light, heavy = Identity.generate(), Identity.generate()
    for i in range(5):
        store.put(record(light, key=f"/moehome/demo/l{i}"), NOW, source="198.18.0.1")
    for i in range(100):
        store.put(record(heavy, key=f"/moehome/demo/h{i}"), NOW, source="198.18.9.9")
    assert all(store.get(f"/moehome/demo/l{i}", NOW) for i in range(5))
    assert store.weight <= limits.max_weight
    assert store.stats.evicted["full"] > 0


def test_noise_in_an_open_namespace_never_pushes_out_the_records_that_matter():
    shares = {"demo": 1 / 16, "peer": 1.0}
    store = RecordStore(StoreLimits(max_weight=200 * 700, source_share=1.0), shares.__getitem__)
    owner = Identity.generate()
    own_key = f"/moehome/peer/{owner.peer_id.to_base58()}"
    assert store.put(record(owner, key=own_key), NOW, source="198.18.0.1")
    for i in range(500):
        who = Identity.from_seed(i.to_bytes(32, "big"))
        store.put(record(who, key=f"/moehome/demo/n{i}"), NOW, source=f"198.18.1.{i % 250}")
    assert store.get(own_key, NOW)
    assert store.stats.evicted["namespace"] > 0


def test_an_author_over_its_weight_loses_its_oldest_records():
    store = RecordStore(StoreLimits(max_author_weight=3 * 700))
    a = Identity.generate()
    for i in range(6):
        store.put(record(a, key=f"/moehome/demo/{i}"), NOW, source="198.18.0.1")
    assert [bool(store.get(f"/moehome/demo/{i}", NOW)) for i in range(6)] == [False] * 3 + [
        True
    ] * 3


def test_a_get_hears_every_address_before_any_twice():
    store = RecordStore()
    crowd = [Identity.generate() for _ in range(20)]
    for who in crowd:
        store.put(record(who), NOW, source="198.18.9.9")
    others = [Identity.generate() for _ in range(3)]
    for i, who in enumerate(others):
        store.put(record(who), NOW, source=f"198.18.0.{i}")
    first = store.get("/moehome/demo/k", NOW, limit=4)
    assert {who.public_key for who in others} <= {r.author for r in first}


ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)


ADDRS = encode_peer_addrs(["/ip4/198.18.0.1/tcp/4001", "/ip4/198.18.0.2/tcp/4001/p2p-circuit"])


def peer_rec(identity: Identity, value: object) -> SignedRecord:
    return record(identity, key=f"/moehome/peer/{identity.peer_id}", value=pack(value))


def test_peer_record_addresses_round_trip_and_are_bounded():
    addrs = [f"/ip4/198.18.0.{i}/tcp/4001" for i in range(20)]
    assert decode_peer_addrs(encode_peer_addrs(addrs)) == addrs[:MAX_PEER_ADDRS]
    too_long = "/ip4/198.18.0.1/tcp/4001/" + "x" * 300
    assert decode_peer_addrs(encode_peer_addrs([too_long, addrs[0]])) == [addrs[0]]
    assert peer_record_key(ALICE.peer_id) == f"/moehome/peer/{ALICE.peer_id.to_base58()}"


def tampered(r: SignedRecord, **changes) -> SignedRecord:
    fields = {
        f: getattr(r, f)
        for f in ("key", "value", "author", "timestamp_ms", "expires_ms", "signature")
    }
    fields.update(changes)
    return SignedRecord(**fields)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: record(ALICE), None),
        (lambda: tampered(record(ALICE), value=b"changed"), "bad_signature"),
        (lambda: tampered(record(ALICE), expires_ms=NOW + 61_000), "bad_signature"),
        (lambda: tampered(record(ALICE), author=BOB.public_key), "bad_signature"),
        (lambda: tampered(record(ALICE), signature=b"x" * 10), "bad_signature"),
        (lambda: record(ALICE, now=NOW - 120_000), "expired"),
        (lambda: record(ALICE, now=NOW + 3_600_000), "from_future"),
        (lambda: record(ALICE, ttl=7200), "ttl_too_long"),
        (lambda: record(ALICE, key="/moehome/other/k"), "unknown_namespace"),
        (lambda: record(ALICE, key="/other/demo/k"), "bad_key"),
        (lambda: record(ALICE, key="/moehome/demo/has space"), "bad_key"),
        (lambda: record(ALICE, value=b"x" * 9000), "too_large"),
        (lambda: record(ALICE, key=f"/moehome/peer/{ALICE.peer_id}", value=ADDRS), None),
        (lambda: record(BOB, key=f"/moehome/peer/{ALICE.peer_id}", value=ADDRS), "wrong_author"),
        (lambda: record(ALICE, key=f"/moehome/peer/{ALICE.peer_id}"), "schema"),
        (lambda: peer_rec(ALICE, {"addrs": ["/ip4/198.18.0.1/tcp/1"] * 17}), "schema"),
        (lambda: peer_rec(ALICE, {"addrs": ["/ip4/198.18.0.1/tcp/" + "1" * 300]}), "schema"),
        (lambda: peer_rec(ALICE, {"addrs": ["no-slash"]}), "schema"),
        (lambda: peer_rec(ALICE, {"addrs": [7]}), "schema"),
        (lambda: peer_rec(ALICE, {"addr": []}), "schema"),
        (lambda: peer_rec(ALICE, ["/ip4/198.18.0.1/tcp/1"]), "schema"),
        (lambda: record(ALICE, key="/moehome/strict/k", value=b"bad"), "schema"),
    ],
)
def test_validator(make, reason):
    def only_good(r: SignedRecord) -> None:
        if r.value != b"good":
            raise RecordRejected("schema", "value must be 'good'")

    validator = NamespacedValidator().with_rules({"strict": NamespaceRule(check=only_good)})
    rec = make()
    if reason is None:
        validator.validate(rec, NOW)
    else:
        with pytest.raises(RecordRejected) as info:
            validator.validate(rec, NOW)
        assert info.value.reason == reason


def test_record_encoding_round_trip_and_bounds():
    r = record(ALICE)
    assert SignedRecord.decode(r.encode(), 4096) == r
    with pytest.raises(RecordRejected, match="too_large"):
        SignedRecord.decode(r.encode(), 10)
    with pytest.raises(RecordRejected, match="malformed"):
        SignedRecord.decode(b"\x92\x01\x02", 4096)


def test_a_fair_rate_gives_a_newcomer_its_first_bytes_at_once_beside_a_hog():
    """Issue 35, finding 8: a relay's one bucket let a hog drain what an honest
    caller's first megabyte needed."""
    fair = FairRate(4.0, min_burst=1.0)
    assert fair.share("hog", 0.0) == 4.0  # alone: the whole rate
    spent = 0.0
    for tick in range(100):  # the hog drains its bucket as fast as it refills
        now = tick * 0.1
        while fair.try_take("hog", 0.1, now):
            spent += 0.1
    assert 4.0 * 9.9 <= spent <= 4.0 * 10.0 + 4.0 + 1e-6  # a second's burst, then the rate
    # a newcomer: half the rate, and a full second of it at once
    assert fair.share("new", 10.0) == 2.0
    assert fair.try_take("new", 2.0, 10.0)
    assert not fair.try_take("new", 0.5, 10.0)
    assert fair.wait_s("new", 0.5, 10.0) == 0.25
    # the hog now refills at half the rate: 0.4 in 0.2 s (0.8 alone)
    assert not fair.try_take("hog", 0.6, 10.1)
    assert fair.try_take("hog", 0.35, 10.1)
    # a source quiet for active_s no longer counts: the hog has the whole rate again
    assert fair.share("hog", 12.5) == 4.0


def test_a_fair_rate_lets_a_chunk_pass_however_many_share_it():
    fair = FairRate(1.0, min_burst=0.5, max_sources=3)
    for i in range(5):
        assert fair.try_take(f"s{i}", 0.5, 0.0)  # each newcomer: one chunk at once
    assert len(fair._sources) == 3  # the least recently used forgotten


def test_a_remembered_signature_is_never_taken_for_a_changed_record():
    """The validator remembers valid signatures (a record comes back from each peer that
    stores it); a record changed in any signed field after its original passed is still
    refused, and an expired one still expires."""
    validator = NamespacedValidator()
    genuine = record(ALICE)
    validator.validate(genuine, NOW)
    validator.validate(genuine, NOW)
    assert (validator.signatures.checked, validator.signatures.remembered) == (1, 1)
    for changed in (
        tampered(genuine, value=b"changed"),
        tampered(genuine, key="/moehome/demo/other"),
        tampered(genuine, author=BOB.public_key),
        tampered(genuine, timestamp_ms=genuine.timestamp_ms - 1),
        tampered(genuine, expires_ms=genuine.expires_ms + 1),
    ):
        with pytest.raises(RecordRejected) as info:
            validator.validate(changed, NOW)
        assert info.value.reason == "bad_signature"
    with pytest.raises(RecordRejected) as info:
        validator.validate(genuine, genuine.expires_ms)
    assert info.value.reason == "expired"
