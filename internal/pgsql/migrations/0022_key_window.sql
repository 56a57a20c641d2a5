-- Idempotency keys: a window set per topic (TopicConfig.KeyWindow), for
-- topics without a retention or with a shorter one, and its key class
-- (see keys.go). No release before names the columns.
ALTER TABLE {{topics}} ADD COLUMN IF NOT EXISTS key_window interval;
ALTER TABLE {{topics}} ADD COLUMN IF NOT EXISTS key_class smallint
