-- The index a relay WithKeyOrder needs (Migrate runs it when given
-- WithKeyOrder): the earliest unsent row of each (topic, key), parked rows
-- included. The key is indexed by its SHA-256, so keys of any length fit
-- a B-tree entry. Without it a key-ordered claim scans every unsent row;
-- the relay's default mode does not use it, and Enqueue pays for one more
-- index entry per row once it exists.
CREATE INDEX IF NOT EXISTS effectively_outbox_unsent_key
    ON effectively_outbox (topic, sha256(key), id) WHERE sent_at IS NULL;
