"""The read side: what a night left, read back from its stored rows.

Nothing here runs a batch or talks to a server; the command line, the web pages, the
digest and the Prometheus scrape all read a night through these modules. Layered
bottom-up (the ``morning`` contract in pyproject.toml): ``summary`` (one batch as the
operator reads it), ``activity``, ``timetable`` (when a night is due), ``timeline``,
``batchids``, ``numbers`` (a figure as text, for pages and tables alike); ``advice``,
``eta``, ``serverview``; ``nightstatus`` (the latest night), ``accounting`` (a batch's
calls, tokens and throughput), ``ranking``, ``series`` (a batch's server gauges over time);
``changes``; ``digest``, ``prometheus`` (the night's metrics) and ``views`` (what each web
page shows: app/web only renders them, and reads no row itself).
"""
