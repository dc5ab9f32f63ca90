"""Redis Cluster: every script jobguard runs touches keys of one hash slot."""

from __future__ import annotations

import re

import pytest

from django_jobguard.cache import _entries, refill
from django_jobguard.locks import redis as redis_locks
from django_jobguard.locks.redis import RedisLock, hash_tag


def crc16_xmodem(data: bytes) -> int:
    """CRC16-CCITT (XModem), the checksum Redis Cluster takes modulo 16384."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(name: str) -> int:
    """The slot Redis Cluster puts ``name`` in (its hash-tag rule, written out independently)."""
    raw = name.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16_xmodem(raw) % 16384


def test_the_slot_function_agrees_with_redis_py_and_the_cluster_specification():
    from redis.crc import key_slot as redis_py_key_slot

    assert crc16_xmodem(b"123456789") == 0x31C3  # the check value in the Cluster specification
    for name in ["order:1", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}"]:
        assert key_slot(name) == redis_py_key_slot(name.encode()), name


KEYS = [
    "order:123",
    "account:7",
    "res:a",
    "invoice:{9}",  # braces inside the key
    "a{b",
    "x}y",
    "{}",
    "ünïcode:Ω",
    "k" * 150,
]


@pytest.mark.parametrize("prefix", ["jobguard:lock:", "shop:{locks}:", "p{"])
@pytest.mark.parametrize("key", KEYS)
def test_a_locks_key_and_its_fencing_counter_share_a_slot(prefix, key):
    lock = RedisLock(key, ttl=30, prefix=prefix)
    assert key_slot(lock.redis_key) == key_slot(lock.fencing_key)
    assert lock.fencing_key == f"{lock.redis_key}:fencing"


def test_the_redis_key_wraps_the_lock_key_in_a_hash_tag():
    lock = RedisLock("order:123", ttl=30, prefix="jobguard:lock:")
    assert (lock.name, lock.redis_key) == ("jobguard:lock:order:123", "jobguard:lock:{order:123}")
    assert hash_tag(lock.redis_key) == "order:123"
    # Different resources land in different slots, so locks spread over a cluster's nodes.
    slots = {key_slot(RedisLock(f"order:{n}", ttl=30, prefix="jobguard:lock:").redis_key) for n in range(50)}
    assert len(slots) > 40


def test_a_lock_whose_hash_tag_would_be_empty_is_refused():
    with pytest.raises(ValueError, match=r"its Redis hash tag would be empty"):
        RedisLock("}order:1", ttl=30, prefix="jobguard:lock:")
    with pytest.raises(ValueError, match=r"avoid '\{\}' in the prefix"):
        RedisLock("order:1", ttl=30, prefix="shop:{}:")


@pytest.mark.parametrize(
    "script",
    [
        redis_locks._ACQUIRE,
        redis_locks._RELEASE,
        redis_locks._EXTEND,
        _entries.SET,
        _entries.TOMBSTONE,
        refill._READ,
        refill._SET_PLAIN,
        refill._RELEASE,
    ],
    ids=[
        "acquire",
        "release",
        "extend",
        "set_versioned",
        "tombstone",
        "refill_read",
        "refill_set",
        "refill_release",
    ],
)
def test_scripts_touch_only_the_keys_they_are_given(script):
    # A key built inside a script would escape the cluster's routing; only KEYS[n] may be used.
    assert not re.search(r"redis\.call\('\w+',\s*(?!\s|KEYS\[)", script.replace("'TIME'", "")), script
    assert set(re.findall(r"KEYS\[(\d)\]", script)) <= {"1", "2"}
