"""initial tables

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "batches",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=True),
        sa.Column("as_of", sa.Date(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("server_facts", sa.JSON(), nullable=True),
        sa.Column(
            "source_batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("tickers_total", sa.Integer(), nullable=False),
        sa.Column("tickers_succeeded", sa.Integer(), nullable=False),
        sa.Column("tickers_failed", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["source_batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "decisions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ticker", sa.String(length=12), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("rating", sa.String(length=16), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch_id", "ticker", "sample", name="uq_decisions_sample"),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_decisions_batch_id"), ["batch_id"], unique=False)

    op.create_table(
        "llm_calls",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ticker", sa.String(length=12), nullable=False),
        sa.Column("node", sa.String(length=40), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_class", sa.String(length=32), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_token_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("request_id", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "batch_id", "ticker", "node", "sample", "attempt", name="uq_llm_calls_attempt"
        ),
    )
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_llm_calls_batch_id"), ["batch_id"], unique=False)

    op.create_table(
        "llm_requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ticker", sa.String(length=12), nullable=False),
        sa.Column("node", sa.String(length=40), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch_id", "ticker", "node", "sample", name="uq_llm_requests_call"),
    )
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_llm_requests_batch_id"), ["batch_id"], unique=False)

    op.create_table(
        "server_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("running", sa.Float(), nullable=False),
        sa.Column("waiting", sa.Float(), nullable=False),
        sa.Column("kv_cache_usage", sa.Float(), nullable=False),
        sa.Column("preemptions_total", sa.Float(), nullable=False),
        sa.Column("prompt_tokens_total", sa.Float(), nullable=False),
        sa.Column("generation_tokens_total", sa.Float(), nullable=False),
        sa.Column("prefix_cache_queries_total", sa.Float(), nullable=True),
        sa.Column("prefix_cache_hits_total", sa.Float(), nullable=True),
        sa.Column("spec_drafts_total", sa.Float(), nullable=True),
        sa.Column("spec_draft_tokens_total", sa.Float(), nullable=True),
        sa.Column("spec_accepted_tokens_total", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_server_samples_batch_id"), ["batch_id"], unique=False)

    op.create_table(
        "ticker_runs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ticker", sa.String(length=12), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch_id", "ticker", name="uq_ticker_runs_batch_ticker"),
    )
    with op.batch_alter_table("ticker_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ticker_runs_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("ticker_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ticker_runs_batch_id"))

    op.drop_table("ticker_runs")
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_server_samples_batch_id"))

    op.drop_table("server_samples")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_llm_requests_batch_id"))

    op.drop_table("llm_requests")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_llm_calls_batch_id"))

    op.drop_table("llm_calls")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decisions_batch_id"))

    op.drop_table("decisions")
    op.drop_table("batches")
