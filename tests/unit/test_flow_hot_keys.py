"""The keys a worker process remembers as hot between its limited claims."""

from django_jobguard.flow.admission import HOT_KEY_MEMORY_SECONDS, HOT_KEYS_REMEMBERED, HotKeys


def test_a_key_is_remembered_for_a_while_from_its_last_sighting():
    keys = HotKeys()
    keys.note(["c:a|1"], now=100.0)
    keys.note(["c:a|2"], now=105.0)
    assert keys.recent(100.0 + HOT_KEY_MEMORY_SECONDS - 0.1) == ["c:a|1", "c:a|2"]
    assert keys.recent(100.0 + HOT_KEY_MEMORY_SECONDS) == ["c:a|2"]
    keys.note(["c:a|1"], now=110.0)  # seen again: remembered afresh, most recent last
    assert keys.recent(110.0 + HOT_KEY_MEMORY_SECONDS - 1) == ["c:a|1"]
    keys.clear()
    assert keys.recent(110.0) == []


def test_only_the_most_recent_keys_are_kept():
    keys = HotKeys()
    for n in range(HOT_KEYS_REMEMBERED + 5):
        keys.note([f"c:a|{n}"], now=1.0 + n / 1000)
    kept = keys.recent(2.0)
    assert kept == [f"c:a|{n}" for n in range(5, HOT_KEYS_REMEMBERED + 5)]
