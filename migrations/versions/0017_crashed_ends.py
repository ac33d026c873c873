"""crashed batches end when they were last alive: rows marked before that rule keep no
marking time as their end

Revision ID: 0017_crashed_ends
Revises: 0016_night_refusals
"""

from alembic import op

revision = "0017_crashed_ends"
down_revision = "0016_night_refusals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A batch marked crashed before the marking stored ``app.morning.summary.last_alive``
    # (the later of its last heartbeat and its last call's end, else its start) holds as its
    # end the moment a later start or `report` found it dead: every view's duration already
    # ends at its last sign of life, so any reader of the table is told the same. Data only,
    # in plain SQL both dialects take (SQLite compares its stored UTC texts in time order);
    # running it again changes nothing.
    op.execute("""
        UPDATE batches SET finished_at = (
            SELECT CASE
                WHEN MAX(llm_calls.ended_at) IS NULL
                    THEN COALESCE(batches.heartbeat_at, batches.started_at)
                WHEN batches.heartbeat_at IS NULL
                    OR MAX(llm_calls.ended_at) > batches.heartbeat_at
                    THEN MAX(llm_calls.ended_at)
                ELSE batches.heartbeat_at END
            FROM llm_calls WHERE llm_calls.batch_id = batches.id)
        WHERE status = 'crashed' AND started_at IS NOT NULL
    """)


def downgrade() -> None:
    pass  # the marking times are not kept: the ends stay as they are
