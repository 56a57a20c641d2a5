ALTER TABLE {{sessions}}
	ADD COLUMN IF NOT EXISTS subscription_hash bigint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS subscription_size integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {{sessions_group_idx}}
	ON {{sessions}} (consumer_group);
