"""The night's orchestration around the engine: what starts a batch and what it is given.

Above ``app.batch`` (it runs the engine) and the read side (the night's wrapper sends the
digest). Layered bottom-up (the ``runs`` contract in pyproject.toml): ``preflight`` (what
every start checks before a row), ``resumable`` (which batches died, which one a resume
continues, and its point the engine reopens it through) and ``checkpoints`` (where the
graph's nodes are kept, handed to the engine); ``nightly`` (one night under the lock, for
the CLI, the timer and the daemon) and ``replay`` (a recorded batch's request graphs,
played back); ``daemon`` (``nightdesk scheduler``, firing the night on its cron).
"""
