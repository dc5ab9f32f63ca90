"""The correction diff names the leaves that changed, nothing else."""

from django_jobguard.admin.diff import ABSENT, Change, changes


def test_a_nested_change_is_one_row_with_its_path():
    original = {"items": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": 1}], "note": "x"}
    corrected = {"items": [{"sku": "A", "qty": 30}, {"sku": "B", "qty": 1}], "note": "x"}
    assert list(changes("order", original, corrected)) == [Change("order.items[0].qty", 2, 30)]


def test_added_and_removed_keys_and_items_are_marked_absent_on_one_side():
    found = list(changes("p", {"a": 1, "b": [1, 2]}, {"b": [1], "c": True}))
    assert found == [Change("p.a", 1, ABSENT), Change("p.b[1]", 2, ABSENT), Change("p.c", ABSENT, True)]


def test_a_type_change_is_a_change_even_when_values_compare_equal():
    assert list(changes("n", 1, 1.0)) == [Change("n", 1, 1.0)]
    assert list(changes("n", True, 1)) == [Change("n", True, 1)]
    assert list(changes("same", {"k": [1]}, {"k": [1]})) == []
