"""moe_hal.identity_table: side data by identity that goes with its object."""

from __future__ import annotations

import gc

import torch

from moe_hal.identity_table import IdentityTable


def test_entries_are_per_object_and_go_with_it():
    table = IdentityTable()
    a, b = torch.zeros(3), torch.zeros(3)  # equal values, different objects
    table.slot(a)["k"] = 1
    assert table.get(a) == {"k": 1} and table.get(b) is None and a in table and b not in table
    assert table.slot(a) is table.get(a)
    key = id(a)
    del a
    gc.collect()
    assert key not in table.ids() and id(b) not in table.ids()


def test_new_replaces_the_earlier_entry_which_still_goes_with_the_object():
    table = IdentityTable()
    t = torch.zeros(2)
    table.new(t)["old"] = 1
    table.new(t)["new"] = 2
    assert table.get(t) == {"new": 2}
    key = id(t)
    del t
    gc.collect()
    assert key not in table.ids()


def test_unhashable_and_value_hashed_objects_are_keyed_by_identity():
    table = IdentityTable()

    class Loud:
        def __hash__(self):
            raise AssertionError("hashed")

        def __eq__(self, other):
            raise AssertionError("compared")

    x = Loud()
    table.slot(x)["v"] = 3
    assert table.get(x) == {"v": 3}
