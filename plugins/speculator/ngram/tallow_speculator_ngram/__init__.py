"""Speculators that need no model: prompt lookup (``ngram``) and ``replay``."""

DISTRIBUTION = "tallow-speculator-ngram"
