"""tallow grammar backend on xgrammar."""
