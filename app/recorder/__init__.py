"""What a batch's control objects say, recorded beside the engine: the live progress and the
summaries of how admission went (the bench's JSON, the `batch finished` line, the stored
time without /metrics), built from the servers' plain state.

Above ``app.batch``, which never imports it: whoever runs the engine (app/runs, app/bench)
attaches a ``Recorder`` to a run. Layered bottom-up (the ``recorder`` contract in
pyproject.toml): ``progress`` and ``figures`` (the summaries), then ``record`` (the ``Recorder``).
"""
