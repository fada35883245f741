"""Test fixture distribution tallow-fixture-halfway (see tests/test_plugin_discovery.py)."""
