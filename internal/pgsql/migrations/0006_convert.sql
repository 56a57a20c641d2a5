ALTER TABLE {{messages}} RENAME TO {{forever_name}};
ALTER TABLE {{forever}}
	ADD COLUMN retention_class smallint NOT NULL DEFAULT 0,
	ADD COLUMN expires_at timestamptz NOT NULL DEFAULT 'infinity';
CREATE TABLE {{messages}} (
	"offset"        bigint GENERATED ALWAYS AS IDENTITY,
	topic           text COLLATE "C" NOT NULL,
	partition       integer NOT NULL DEFAULT 0,
	transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuid            text NOT NULL,
	payload         bytea,
	metadata        jsonb,
	created_at      timestamptz NOT NULL DEFAULT now(),
	retention_class smallint NOT NULL DEFAULT 0,
	expires_at      timestamptz NOT NULL DEFAULT 'infinity'
) PARTITION BY RANGE (retention_class, expires_at);
PERFORM setval(pg_get_serial_sequence({{messages_literal}}, 'offset'),
	COALESCE(pg_sequence_last_value(pg_get_serial_sequence({{forever_literal}}, 'offset')::regclass), 0) + 1,
	false);
ALTER TABLE {{forever}} ALTER COLUMN "offset" DROP IDENTITY;
ALTER TABLE {{messages}} ATTACH PARTITION {{forever}}
	FOR VALUES FROM (0, MINVALUE) TO (1, MINVALUE);
