CREATE TABLE IF NOT EXISTS {{version}} (
	version     integer PRIMARY KEY,
	description text NOT NULL,
	applied_at  timestamptz NOT NULL DEFAULT now()
)
