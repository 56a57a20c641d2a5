ALTER TABLE {{offsets}}
	ADD COLUMN IF NOT EXISTS acked_above text[] NOT NULL DEFAULT '{}';
