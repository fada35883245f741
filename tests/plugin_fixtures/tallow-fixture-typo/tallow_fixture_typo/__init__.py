"""Test fixture distribution tallow-fixture-typo (see tests/test_plugin_discovery.py)."""
