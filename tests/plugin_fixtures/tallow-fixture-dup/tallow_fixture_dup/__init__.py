"""Test fixture distribution tallow-fixture-dup (see tests/test_plugin_discovery.py)."""
