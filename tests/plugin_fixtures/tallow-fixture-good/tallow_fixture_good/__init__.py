"""Test fixture distribution tallow-fixture-good (see tests/test_plugin_discovery.py)."""
