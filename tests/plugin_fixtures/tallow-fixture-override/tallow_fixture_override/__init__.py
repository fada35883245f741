"""Test fixture distribution tallow-fixture-override (see tests/test_plugin_discovery.py)."""
