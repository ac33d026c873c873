"""call id: attempts group by the call they belong to and are numbered 1, 2, 3 within it

``llm_calls`` and ``llm_requests`` gain ``call_id``, one per chat call (the body sent and every
HTTP attempt of it, on any endpoint). ``llm_calls`` is unique on (call_id, attempt) instead of
(batch, ticker, node, sample, attempt); ``llm_requests`` is unique on call_id and loses
``attempt``.

Rows stored before this revision are grouped by the body they were sent with: a call row
belongs to the node's request whose first attempt is the greatest not after its own (the
node's only call when no body was recorded). Its call id is "batch:ticker:node:sample:first"
and its attempt is renumbered from 1 within that call; the rows themselves are kept.

Revision ID: 0011_call_id
Revises: 0010_ready_at
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_call_id"
down_revision = "0010_ready_at"
branch_labels = None
depends_on = None

# What the rows from before this revision are keyed by: the node, then the first attempt of
# the request they belong to (portable SQL: SQLite and PostgreSQL both concatenate with ||).
_NODE = ("CAST({t}.batch_id AS VARCHAR(20)) || ':' || {t}.ticker || ':' || {t}.node"
         " || ':' || CAST({t}.sample AS VARCHAR(10))")
_FIRST = ("COALESCE((SELECT MAX(r.attempt) FROM llm_requests r"
          " WHERE r.batch_id = llm_calls.batch_id AND r.ticker = llm_calls.ticker"
          " AND r.node = llm_calls.node AND r.sample = llm_calls.sample"
          " AND r.attempt <= llm_calls.attempt), 1)")


def upgrade() -> None:
    # The old key goes first: renumbering row by row would meet it on the way.
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("call_id", sa.String(100), nullable=True))
        batch_op.drop_constraint("uq_llm_calls_attempt", type_="unique")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("call_id", sa.String(100), nullable=True))
    node = _NODE.format(t="llm_calls")
    # One statement, so both SET clauses read the row's old attempt.
    op.execute(f"UPDATE llm_calls SET call_id = {node} || ':' || CAST({_FIRST} AS VARCHAR(10)),"
               f" attempt = attempt - {_FIRST} + 1")
    op.execute(f"UPDATE llm_requests SET call_id = {_NODE.format(t='llm_requests')}"
               " || ':' || CAST(llm_requests.attempt AS VARCHAR(10))")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.alter_column("call_id", existing_type=sa.String(100), nullable=False)
        batch_op.create_unique_constraint("uq_llm_calls_call_attempt", ["call_id", "attempt"])
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.alter_column("call_id", existing_type=sa.String(100), nullable=False)
        batch_op.drop_constraint("uq_llm_requests_attempt", type_="unique")
        batch_op.create_unique_constraint("uq_llm_requests_call", ["call_id"])
        batch_op.drop_column("attempt")


def downgrade() -> None:
    # Attempts are numbered through the node again, in the order they were stored; a body
    # whose call never reached the server cannot be placed in that numbering and goes.
    op.execute("DELETE FROM llm_requests WHERE NOT EXISTS"
               " (SELECT 1 FROM llm_calls c WHERE c.call_id = llm_requests.call_id)")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_constraint("uq_llm_calls_call_attempt", type_="unique")
    op.execute("UPDATE llm_calls SET attempt = (SELECT COUNT(*) FROM llm_calls c"
               " WHERE c.batch_id = llm_calls.batch_id AND c.ticker = llm_calls.ticker"
               " AND c.node = llm_calls.node AND c.sample = llm_calls.sample"
               " AND c.id <= llm_calls.id)")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False,
                                      server_default="1"))
    op.execute("UPDATE llm_requests SET attempt = (SELECT MIN(c.attempt) FROM llm_calls c"
               " WHERE c.call_id = llm_requests.call_id)")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_constraint("uq_llm_requests_call", type_="unique")
        batch_op.create_unique_constraint(
            "uq_llm_requests_attempt", ["batch_id", "ticker", "node", "sample", "attempt"])
        batch_op.drop_column("call_id")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.create_unique_constraint(
            "uq_llm_calls_attempt", ["batch_id", "ticker", "node", "sample", "attempt"])
        batch_op.drop_column("call_id")
