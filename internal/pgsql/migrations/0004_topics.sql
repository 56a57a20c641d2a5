CREATE TABLE IF NOT EXISTS {{topics}} (
	topic      text COLLATE "C" PRIMARY KEY,
	partitions integer NOT NULL DEFAULT 1 CHECK (partitions >= 1),
	created_at timestamptz NOT NULL DEFAULT now(),
	updated_at timestamptz NOT NULL DEFAULT now()
);
