"""tallow grammar backend on llguidance."""
