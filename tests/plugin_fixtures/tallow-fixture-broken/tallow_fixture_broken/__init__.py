"""Test fixture distribution tallow-fixture-broken (see tests/test_plugin_discovery.py)."""
