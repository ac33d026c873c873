"""Measure nightdesk's own costs (``nightdesk bench ...``); no timed tests, only reports."""
