"""Run the CLI as ``python -m app.cli``: how the web server starts ``nightdesk rerun``."""

from app.cli import main

main()
