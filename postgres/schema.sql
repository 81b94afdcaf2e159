-- Schema for effectively.dev/postgres. Every statement is idempotent, and
-- Migrate runs them in one transaction under an advisory lock, so concurrent
-- Migrate calls are safe.

-- One row per effect done under an adapter-owned or caller-owned
-- transaction. The row commits or rolls back with the effect's own writes;
-- the primary key is what makes a second delivery a replay.
CREATE TABLE IF NOT EXISTS effectively_keys (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    ref         text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- Serves Prune: WHERE scope = $1 AND created_at < $2.
CREATE INDEX IF NOT EXISTS effectively_keys_scope_created_at
    ON effectively_keys (scope, created_at);

-- Sent-records for effects outside the database (Journal). lease_until is
-- NULL when no attempt holds the key (done, or released). ref is the
-- effect's reference once done; before that, the holder token of the
-- lease's Begin (a Journal takes a lease back by its token when the reply
-- to the statement that took it was lost; '' when written by a version
-- before the tokens).
CREATE TABLE IF NOT EXISTS effectively_journal (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    done        boolean     NOT NULL DEFAULT false,
    ref         text        NOT NULL DEFAULT '',
    attempt     integer     NOT NULL DEFAULT 1,
    lease_until timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- Serves Journal.Prune: WHERE scope = $1 AND created_at < $2.
CREATE INDEX IF NOT EXISTS effectively_journal_scope_created_at
    ON effectively_journal (scope, created_at);
