"""Alembic's migration scripts, shipped as package data so an installed nightdesk finds them."""
