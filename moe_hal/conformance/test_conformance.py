"""The conformance suite as pytest tests (collected by ``--pyargs moe_hal.conformance``).

Needs the plugin: ``pytest -p moe_hal.conformance.plugin --pyargs moe_hal.conformance --moe-backend NAME``
(or ``moe_backend = NAME`` in the pytest configuration; without a backend these tests skip).
The parametrization (one test per case and path) comes from the plugin's ``pytest_generate_tests``.
"""

import sys

import pytest

if "moe_hal.conformance.plugin" not in sys.modules:
    pytest.skip(
        "the conformance tests need their plugin: pytest -p moe_hal.conformance.plugin "
        "--pyargs moe_hal.conformance --moe-backend NAME",
        allow_module_level=True,
    )


def test_backend_available(moe_conformance):
    moe_conformance.check_available()


def test_case(moe_conformance_item, moe_conformance, request):
    moe_conformance.check(moe_conformance_item, request.node)


def test_fuzz(moe_conformance):
    moe_conformance.fuzz()
