-- Schema for effectively.dev/mysql (MySQL 5.7+, MariaDB 10.3+). Every
-- statement is idempotent (CREATE TABLE IF NOT EXISTS); Migrate runs them
-- one by one. The tables are InnoDB: the key's row must commit and roll
-- back with the effect's own writes.
--
-- scope and key are VARBINARY: compared byte by byte. A VARCHAR in a
-- case- or accent-insensitive collation (utf8mb4_general_ci, MySQL 8's
-- utf8mb4_0900_ai_ci, the defaults) makes 'Order-7' and 'order-7' one key;
-- utf8mb4_bin, a PAD SPACE collation in MariaDB and MySQL 5.7, makes
-- 'tenant' and 'tenant ' one scope. Two distinct messages would then share
-- one dedup row, and the second would be acknowledged without its effect.

-- One row per effect done in an adapter-owned transaction. The row commits
-- or rolls back with the effect's own writes; the primary key is what
-- makes a second delivery a replay.
CREATE TABLE IF NOT EXISTS effectively_keys (
    scope       VARBINARY(255) NOT NULL,
    `key`       VARBINARY(255) NOT NULL,
    fingerprint BLOB           NOT NULL,
    ref         BLOB           NOT NULL,
    created_at  TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (scope, `key`),
    KEY effectively_keys_scope_created_at (scope, created_at)
) ENGINE=InnoDB;

-- Sent-records for effects outside the database (Journal). lease_until is
-- NULL when no attempt holds the key (done, or released). ref is the
-- effect's reference once done; before that, the holder token of the
-- lease's Begin.
CREATE TABLE IF NOT EXISTS effectively_journal (
    scope       VARBINARY(255) NOT NULL,
    `key`       VARBINARY(255) NOT NULL,
    fingerprint BLOB           NOT NULL,
    done        BOOLEAN        NOT NULL DEFAULT FALSE,
    ref         BLOB           NOT NULL,
    attempt     INT            NOT NULL DEFAULT 1,
    lease_until TIMESTAMP(6)   NULL DEFAULT NULL,
    created_at  TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at  TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (scope, `key`),
    KEY effectively_journal_scope_created_at (scope, created_at)
) ENGINE=InnoDB;
