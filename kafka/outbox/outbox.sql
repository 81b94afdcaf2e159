-- Schema for the transactional outbox of effectively.dev/kafka/outbox. Every
-- statement is idempotent; Migrate runs them in one transaction under
-- an advisory lock, so concurrent migrations are safe.

-- One row per record to publish, inserted by Enqueue in the application's
-- business transaction. A relay claims unsent rows in a short transaction
-- (claimed_until, claim_token), produces them outside any transaction, and
-- sets sent_at and ref ("partition/offset") in a second short transaction
-- after the broker's ack. A row the broker refuses for good, or that
-- failed the relay's attempt limit, is parked (parked_at, error_class,
-- last_error): kept, and never claimed again until ParkedFilter.Retry.
CREATE TABLE IF NOT EXISTS effectively_outbox (
    id            bigserial   PRIMARY KEY,
    message_id    text        NOT NULL,
    fingerprint   bytea       NOT NULL,
    topic         text        NOT NULL,
    key           bytea,
    value         bytea,
    header_keys   text[]      NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz,
    ref           text,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claimed_until timestamptz,
    claim_token   bigint,
    parked_at     timestamptz,
    error_class   text
);

-- A message id is enqueued once: Enqueue of the same id again is a no-op
-- (or ErrKeyReused with another payload), until the row is pruned.
CREATE UNIQUE INDEX IF NOT EXISTS effectively_outbox_message_id
    ON effectively_outbox (message_id);

-- Serves the relay's claim: rows neither sent nor parked, in id order.
CREATE INDEX IF NOT EXISTS effectively_outbox_pending
    ON effectively_outbox (id) WHERE sent_at IS NULL AND parked_at IS NULL;

-- Serves the ParkedFilter methods.
CREATE INDEX IF NOT EXISTS effectively_outbox_parked
    ON effectively_outbox (id) WHERE parked_at IS NOT NULL;
