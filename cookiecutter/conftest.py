"""The template's files are Jinja templates, not importable Python: never collect them here.
(Render the template first; the rendered project's tests run there.)"""

collect_ignore_glob = ["{{*"]
