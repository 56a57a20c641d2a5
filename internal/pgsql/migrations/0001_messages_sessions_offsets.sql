CREATE TABLE IF NOT EXISTS {{messages}} (
	"offset"       bigint GENERATED ALWAYS AS IDENTITY,
	topic          text COLLATE "C" NOT NULL,
	partition      integer NOT NULL DEFAULT 0,
	transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuid           text NOT NULL,
	payload        bytea,
	metadata       jsonb,
	created_at     timestamptz NOT NULL DEFAULT now(),
	-- The read path's index is the primary key: one index per row written.
	-- Topics compare bytewise ("C"), whatever the database's collation.
	PRIMARY KEY (topic, partition, transaction_id, "offset")
);

CREATE TABLE IF NOT EXISTS {{sessions}} (
	id             uuid PRIMARY KEY,
	consumer_group text NOT NULL,
	owner          text NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now(),
	expires_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {{sessions_expires_at_idx}}
	ON {{sessions}} (expires_at);

CREATE TABLE IF NOT EXISTS {{offsets}} (
	consumer_group       text NOT NULL,
	topic                text NOT NULL,
	partition            integer NOT NULL DEFAULT 0,
	acked_transaction_id xid8 NOT NULL DEFAULT '0',
	acked_offset         bigint NOT NULL DEFAULT 0,
	session_id           uuid,
	lease_expires_at     timestamptz,
	epoch                bigint NOT NULL DEFAULT 0,
	updated_at           timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, topic, partition)
);
