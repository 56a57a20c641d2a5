ALTER TABLE {{topics}}
	ADD COLUMN IF NOT EXISTS retention interval NOT NULL DEFAULT '0',
	ADD COLUMN IF NOT EXISTS retention_class smallint NOT NULL DEFAULT 0,
	-- The classes the topic's messages may be stored under: 0, and those
	-- from classes_from to classes_to (every class it ever had lies
	-- there; 0 and 0 when it never had a retention). Readers read only
	-- those partitions.
	ADD COLUMN IF NOT EXISTS classes_from smallint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS classes_to smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {{topics_retention_idx}}
	ON {{topics}} (retention_class) WHERE retention_class > 0;

-- One row per retention class in use: the partitions of the class cover
-- expiry times up to covered_until, contiguously from the present on.
CREATE TABLE IF NOT EXISTS {{retention}} (
	retention_class smallint PRIMARY KEY,
	covered_until   timestamptz NOT NULL DEFAULT '-infinity',
	updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Messages published with a delay wait here until due_at.
CREATE TABLE IF NOT EXISTS {{delayed}} (
	id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	due_at         timestamptz NOT NULL,
	topic          text COLLATE "C" NOT NULL,
	partition_hash integer,
	uuid           text NOT NULL,
	payload        bytea,
	metadata       jsonb,
	created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {{delayed_due_idx}}
	ON {{delayed}} (due_at, id);

-- The maintainer: the row is owned through a consumer session, like an
-- offset row.
CREATE TABLE IF NOT EXISTS {{maintenance}} (
	name       text PRIMARY KEY,
	session_id uuid,
	epoch      bigint NOT NULL DEFAULT 0,
	updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{maintenance}} (name) VALUES ('maintainer') ON CONFLICT (name) DO NOTHING;

{{do 0006_convert_messages.plpgsql}};
