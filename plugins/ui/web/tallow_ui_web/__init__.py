"""tallow's chat web UI: static files served at ``/ui`` when ``server.ui`` is on."""
