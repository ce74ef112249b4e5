"""The tests, a package so that every test module has a unique dotted name (``tests.flows.test_config``)
and ``from tests.conftest import ...`` works from the repository root, also under pytest-xdist.

The tree mirrors the packages (``tests/hermes_core/``, ``tests/flows/``, ``tests/tasks/``); ``tests/e2e/`` holds the
whole-product tests (command line, deployments). Shared fixtures are in ``tests/conftest.py``.
"""
