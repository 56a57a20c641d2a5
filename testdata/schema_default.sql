BEGIN;
DO $pglease$
DECLARE
	target name := '';
	nsp oid;
	nsp_owner oid;
	trusted oid[];
	bad text;
BEGIN
	IF true THEN
		target := pg_catalog.current_schema();
		IF target IS NULL THEN
			RAISE EXCEPTION 'pglease: no schema to create the tables in: the search_path (%) names no schema that exists', pg_catalog.current_setting('search_path')
				USING ERRCODE = 'invalid_schema_name', HINT = 'Set DefaultSchemaAdapter.Schema, or the role''s search_path.';
		END IF;
	END IF;
	-- From here on, every name this transaction runs resolves in
	-- pg_catalog first; only the schema of the tables, when Schema is not
	-- set, comes before it, so that unqualified names create and find the
	-- tables there (its creators are checked below).
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	SELECT n.oid, n.nspowner INTO nsp, nsp_owner FROM pg_namespace n WHERE n.nspname = target;
	IF nsp IS NULL THEN
		RETURN; -- created by the set-up, by the migrating role
	END IF;
	-- The roles trusted with the schema: its owner, the migrating role and
	-- the roles it is a member of (by pg_auth_members, which a superuser's
	-- access to every role does not count as).
	WITH RECURSIVE m(role) AS (
		SELECT current_user::regrole::oid
		UNION
		SELECT a.roleid FROM pg_auth_members a JOIN m ON a.member = m.role
	)
	SELECT array_agg(role) || nsp_owner INTO trusted FROM m;
	SELECT string_agg(CASE WHEN a.grantee = 0::oid THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END, ', '
			ORDER BY a.grantee)
		INTO bad
	FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
	WHERE n.oid = nsp AND a.privilege_type = 'CREATE' AND NOT (a.grantee = ANY (trusted));
	IF bad IS NOT NULL THEN
		RAISE EXCEPTION 'pglease: roles other than the owner of schema % and the migrating role % may create objects in it: %', quote_ident(target), quote_ident(current_user::text), bad
			USING ERRCODE = 'insufficient_privilege',
				HINT = 'An object another role creates there could run with the privileges of the roles that use the tables. Revoke CREATE on the schema from those roles, or set DefaultSchemaAdapter.Schema to a schema of the owner''s own.';
	END IF;
	SELECT string_agg(format('%s (owned by %s)', c.oid::regclass, quote_ident(pg_get_userbyid(c.relowner))), ', ' ORDER BY c.relname)
		INTO bad
	FROM pg_class c
	WHERE c.relnamespace = nsp AND c.relname = ANY (ARRAY['pglease_messages', 'pglease_consumer_sessions', 'pglease_consumer_offsets', 'pglease_schema_version', 'pglease_topics', 'pglease_delayed', 'pglease_maintenance', 'pglease_retention', 'pglease_messages_forever']::name[]) AND NOT (c.relowner = ANY (trusted));
	IF bad IS NOT NULL THEN
		RAISE EXCEPTION 'pglease: tables of pglease exist already, owned by a role other than the owner of schema % and the migrating role %: %', quote_ident(target), quote_ident(current_user::text), bad
			USING ERRCODE = 'insufficient_privilege',
				HINT = 'Run the migration as the role that owns them, or drop them if pglease did not create them.';
	END IF;
	IF true THEN
		PERFORM set_config('search_path', quote_ident(target) || ', pg_catalog, pg_temp', true);
	END IF;
END
$pglease$;
CREATE TABLE IF NOT EXISTS "pglease_schema_version" (
	version     integer PRIMARY KEY,
	description text NOT NULL,
	applied_at  timestamptz NOT NULL DEFAULT now()
);

-- version 1: messages, consumer sessions and consumer offsets
CREATE TABLE IF NOT EXISTS "pglease_messages" (
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

CREATE TABLE IF NOT EXISTS "pglease_consumer_sessions" (
	id             uuid PRIMARY KEY,
	consumer_group text NOT NULL,
	owner          text NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now(),
	expires_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS "pglease_consumer_sessions_expires_at_idx"
	ON "pglease_consumer_sessions" (expires_at);

CREATE TABLE IF NOT EXISTS "pglease_consumer_offsets" (
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
INSERT INTO "pglease_schema_version" (version, description) VALUES (1, 'messages, consumer sessions and consumer offsets') ON CONFLICT (version) DO NOTHING;

-- version 2: consumer_offsets.lease_expires_at is no longer used
COMMENT ON COLUMN "pglease_consumer_offsets".lease_expires_at IS
	'Unused since pglease schema version 2 (always NULL); kept for Subscribers of version 1 during a rolling upgrade.';
INSERT INTO "pglease_schema_version" (version, description) VALUES (2, 'consumer_offsets.lease_expires_at is no longer used') ON CONFLICT (version) DO NOTHING;

-- version 3: consumer groups: the rows each session subscribes to
ALTER TABLE "pglease_consumer_sessions"
	ADD COLUMN IF NOT EXISTS subscription_hash bigint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS subscription_size integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS "pglease_consumer_sessions_group_idx"
	ON "pglease_consumer_sessions" (consumer_group);
INSERT INTO "pglease_schema_version" (version, description) VALUES (3, 'consumer groups: the rows each session subscribes to') ON CONFLICT (version) DO NOTHING;

-- version 4: topic settings: partition count
CREATE TABLE IF NOT EXISTS "pglease_topics" (
	topic      text COLLATE "C" PRIMARY KEY,
	partitions integer NOT NULL DEFAULT 1 CHECK (partitions >= 1),
	created_at timestamptz NOT NULL DEFAULT now(),
	updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "pglease_schema_version" (version, description) VALUES (4, 'topic settings: partition count') ON CONFLICT (version) DO NOTHING;

-- version 5: delivery attempts: claims that handed out the message after the position
ALTER TABLE "pglease_consumer_offsets"
	ADD COLUMN IF NOT EXISTS head_deliveries integer NOT NULL DEFAULT 0;
INSERT INTO "pglease_schema_version" (version, description) VALUES (5, 'delivery attempts: claims that handed out the message after the position') ON CONFLICT (version) DO NOTHING;

-- version 6: maintenance: retention partitions, delayed messages, the maintainer's election
ALTER TABLE "pglease_topics"
	ADD COLUMN IF NOT EXISTS retention interval NOT NULL DEFAULT '0',
	ADD COLUMN IF NOT EXISTS retention_class smallint NOT NULL DEFAULT 0,
	-- The classes the topic's messages may be stored under: 0, and those
	-- from classes_from to classes_to (every class it ever had lies
	-- there; 0 and 0 when it never had a retention). Readers read only
	-- those partitions.
	ADD COLUMN IF NOT EXISTS classes_from smallint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS classes_to smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS "pglease_topics_retention_idx"
	ON "pglease_topics" (retention_class) WHERE retention_class > 0;

-- One row per retention class in use: the partitions of the class cover
-- expiry times up to covered_until, contiguously from the present on.
CREATE TABLE IF NOT EXISTS "pglease_retention" (
	retention_class smallint PRIMARY KEY,
	covered_until   timestamptz NOT NULL DEFAULT '-infinity',
	updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Messages published with a delay wait here until due_at.
CREATE TABLE IF NOT EXISTS "pglease_delayed" (
	id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	due_at         timestamptz NOT NULL,
	topic          text COLLATE "C" NOT NULL,
	partition_hash integer,
	uuid           text NOT NULL,
	payload        bytea,
	metadata       jsonb,
	created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "pglease_delayed_due_idx"
	ON "pglease_delayed" (due_at, id);

-- The maintainer: the row is owned through a consumer session, like an
-- offset row.
CREATE TABLE IF NOT EXISTS "pglease_maintenance" (
	name       text PRIMARY KEY,
	session_id uuid,
	epoch      bigint NOT NULL DEFAULT 0,
	updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "pglease_maintenance" (name) VALUES ('maintainer') ON CONFLICT (name) DO NOTHING;

DO $pglease$
DECLARE
	old_table regclass;
	new_table regclass;
	storage regclass[];
	r record;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass('"pglease_messages"')) THEN
		EXECUTE 'ALTER TABLE "pglease_messages" RENAME TO "pglease_messages_forever"';
		EXECUTE 'ALTER TABLE "pglease_messages_forever"
	ADD COLUMN retention_class smallint NOT NULL DEFAULT 0,
	ADD COLUMN expires_at timestamptz NOT NULL DEFAULT ''infinity''';
		EXECUTE 'CREATE TABLE "pglease_messages" (
	"offset"        bigint GENERATED ALWAYS AS IDENTITY,
	topic           text COLLATE "C" NOT NULL,
	partition       integer NOT NULL DEFAULT 0,
	transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuid            text NOT NULL,
	payload         bytea,
	metadata        jsonb,
	created_at      timestamptz NOT NULL DEFAULT now(),
	retention_class smallint NOT NULL DEFAULT 0,
	expires_at      timestamptz NOT NULL DEFAULT ''infinity''
) PARTITION BY RANGE (retention_class, expires_at)';
		PERFORM setval(pg_get_serial_sequence('"pglease_messages"', 'offset'),
	COALESCE(pg_sequence_last_value(pg_get_serial_sequence('"pglease_messages_forever"', 'offset')::regclass), 0) + 1,
	false);
		EXECUTE 'ALTER TABLE "pglease_messages_forever" ALTER COLUMN "offset" DROP IDENTITY';
		EXECUTE 'ALTER TABLE "pglease_messages" ATTACH PARTITION "pglease_messages_forever"
	FOR VALUES FROM (0, MINVALUE) TO (1, MINVALUE)';

		old_table := to_regclass('"pglease_messages_forever"');
		new_table := to_regclass('"pglease_messages"');
		storage := ARRAY[to_regclass('"pglease_delayed"'), to_regclass('"pglease_retention"'),
			to_regclass('"pglease_maintenance"')];
		FOR r IN SELECT c.oid::regclass AS tbl, pg_get_userbyid(o.relowner) AS owner
			FROM pg_class o, pg_class c
			WHERE o.oid = old_table AND c.oid = ANY (new_table || storage) AND c.relowner <> o.relowner
		LOOP
			EXECUTE format('ALTER TABLE %s OWNER TO %I', r.tbl, r.owner);
		END LOOP;
		FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable
			FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
			WHERE c.oid = old_table AND a.grantee <> c.relowner
		LOOP
			EXECUTE format('GRANT %s ON TABLE %s TO %s%s', r.privilege_type, new_table,
				CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
				CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			IF r.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') THEN
				EXECUTE format('GRANT %s ON TABLE %s TO %s%s', r.privilege_type, array_to_string(storage, ', '),
					CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
					CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			END IF;
		END LOOP;
		FOR r IN SELECT att.attname, a.grantee, a.privilege_type, a.is_grantable
			FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
			WHERE att.attrelid = old_table AND att.attnum > 0 AND NOT att.attisdropped
				AND a.grantee <> (SELECT relowner FROM pg_class WHERE oid = old_table)
		LOOP
			EXECUTE format('GRANT %s (%I) ON TABLE %s TO %s%s', r.privilege_type, r.attname, new_table,
				CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
				CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
		IF (SELECT relrowsecurity FROM pg_class WHERE oid = old_table) THEN
			EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', new_table);
		END IF;
		IF (SELECT relforcerowsecurity FROM pg_class WHERE oid = old_table) THEN
			EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', new_table);
		END IF;
		FOR r IN SELECT p.polname, p.polpermissive, p.polcmd, p.polroles,
				pg_get_expr(p.polqual, p.polrelid) AS qual, pg_get_expr(p.polwithcheck, p.polrelid) AS with_check
			FROM pg_policy p WHERE p.polrelid = old_table
		LOOP
			EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s', r.polname, new_table,
				CASE WHEN r.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
				CASE r.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
				(SELECT string_agg(CASE WHEN g = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g)) END, ', ') FROM unnest(r.polroles) g),
				CASE WHEN r.qual IS NULL THEN '' ELSE ' USING (' || r.qual || ')' END,
				CASE WHEN r.with_check IS NULL THEN '' ELSE ' WITH CHECK (' || r.with_check || ')' END);
		END LOOP;
		-- Row filters and column lists of publications exist from PostgreSQL 15 on.
		FOR r IN EXECUTE CASE WHEN current_setting('server_version_num')::integer >= 150000 THEN
				'SELECT p.pubname, p.pubviaroot, pg_get_expr(pr.prqual, pr.prrelid) AS qual,
					(SELECT string_agg(quote_ident(att.attname), '', '' ORDER BY att.attnum) FROM pg_attribute att
						WHERE att.attrelid = pr.prrelid AND att.attnum = ANY (pr.prattrs)) AS cols
				FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = $1'
			ELSE
				'SELECT p.pubname, p.pubviaroot, NULL::text AS qual, NULL::text AS cols
				FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = $1'
			END USING old_table
		LOOP
			IF NOT r.pubviaroot AND (r.qual IS NOT NULL OR r.cols IS NOT NULL) THEN
				RAISE WARNING 'pglease: publication % lists % with a row filter or a column list, which PostgreSQL does not allow for the partitioned table % unless the publication has publish_via_partition_root: add it yourself', r.pubname, old_table, new_table;
			ELSE
				BEGIN
					EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s%s%s', r.pubname, new_table,
						CASE WHEN r.cols IS NULL THEN '' ELSE ' (' || r.cols || ')' END,
						CASE WHEN r.qual IS NULL THEN '' ELSE ' WHERE (' || r.qual || ')' END);
				EXCEPTION WHEN insufficient_privilege THEN
					RAISE EXCEPTION 'pglease: the upgrade must add % to publication %, which role % may not alter', new_table, r.pubname, current_user
						USING HINT = 'Run the migration as the owner of the publication or as a superuser.';
				END;
			END IF;
		END LOOP;
	END IF;
END
$pglease$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (6, 'maintenance: retention partitions, delayed messages, the maintainer''s election') ON CONFLICT (version) DO NOTHING;

-- version 7: least privilege: the maintainer's partition DDL through the owner's SECURITY DEFINER functions
DO $pglease1$
DECLARE
	msgs regclass := to_regclass('"pglease_messages"');
	nsp name;
	owner name;
	fn text;
	fns text[] := '{}';
	r record;
BEGIN
	SELECT n.nspname, pg_get_userbyid(c.relowner) INTO nsp, owner
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % is missing', '"pglease_messages"';
	END IF;
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_add_retention_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint, p_end bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''5s''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	IF p_end IS DISTINCT FROM p_start + width THEN
		RAISE EXCEPTION 'pglease: partition end % is not the end of the slot of class % from %', p_end, p_class, p_start
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = nsp AND c.relname = part) THEN
		RETURN false;
	END IF;
	EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)', nsp, part, nsp, msgs);
	EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (topic, partition, transaction_id, "offset")', nsp, part);
	EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s, to_timestamp(%s)) TO (%s, to_timestamp(%s))',
		nsp, msgs, nsp, part, p_class, p_start, p_class, p_end);
	EXECUTE format('UPDATE %I.%I SET covered_until = $1, updated_at = now() WHERE retention_class = $2 AND covered_until < $1', nsp, retention)
		USING to_timestamp(p_end), p_class::smallint;
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint, bigint)');
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_expire_retention_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''500ms''
		SET TimeZone = ''UTC''
		SET DateStyle = ''ISO''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
	rel oid;
	pending boolean;
	bound text;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	IF to_timestamp(p_start + width) > now() THEN
		RAISE EXCEPTION 'pglease: the slot of class % from % has not passed yet', p_class, to_timestamp(p_start)
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	SELECT c.oid, i.inhdetachpending, pg_get_expr(c.relpartbound, c.oid) INTO rel, pending, bound
	FROM pg_class p
	JOIN pg_namespace pn ON pn.oid = p.relnamespace
	JOIN pg_inherits i ON i.inhparent = p.oid
	JOIN pg_class c ON c.oid = i.inhrelid
	WHERE pn.nspname = nsp AND p.relname = msgs AND c.relnamespace = p.relnamespace AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	-- Only the partition of that slot: one that covers more (made by hand,
	-- or by a role that could call an earlier version of the function
	-- that added any range) holds messages whose slot has not passed.
	IF bound IS DISTINCT FROM format('FOR VALUES FROM (%L, %L) TO (%L, %L)', p_class, to_timestamp(p_start), p_class, to_timestamp(p_start + width)) THEN
		RAISE EXCEPTION 'pglease: %.% covers %, not the slot of class % from %: it is left to the owner', nsp, part, bound, p_class, to_timestamp(p_start)
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF pending THEN
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I FINALIZE', nsp, msgs, nsp, part);
	ELSE
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', nsp, msgs, nsp, part);
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint)');
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_drop_detached_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''5s''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
	rel oid;
	parent oid;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	SELECT p.oid INTO parent FROM pg_class p JOIN pg_namespace pn ON pn.oid = p.relnamespace
	WHERE pn.nspname = nsp AND p.relname = msgs;
	SELECT c.oid INTO rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = nsp AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF parent IS NULL
		OR (SELECT c.relkind <> 'r' OR c.relispartition FROM pg_class c WHERE c.oid = rel)
		OR EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = rel OR inhparent = rel)
		OR (SELECT c.relowner FROM pg_class c WHERE c.oid = rel) NOT IN
			((SELECT p.relowner FROM pg_class p WHERE p.oid = parent), current_user::regrole::oid)
		OR NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = 'expires_at' AND NOT attisdropped)
		OR EXISTS (SELECT 1 FROM pg_attribute x WHERE x.attrelid = rel AND x.attnum > 0 AND NOT x.attisdropped
			AND NOT EXISTS (SELECT 1 FROM pg_attribute y WHERE y.attrelid = parent AND y.attname = x.attname
				AND y.atttypid = x.atttypid AND NOT y.attisdropped))
	THEN
		RAISE EXCEPTION 'pglease: %.% is not a detached retention partition of %.%', nsp, part, nsp, msgs
			USING ERRCODE = 'wrong_object_type';
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint)');
	FOREACH fn IN ARRAY fns LOOP
		EXECUTE 'REVOKE ALL ON FUNCTION ' || fn || ' FROM PUBLIC';
		IF owner <> current_user THEN
			EXECUTE 'ALTER FUNCTION ' || fn || ' OWNER TO ' || quote_ident(owner);
		END IF;
		-- The roles that consume today (and may be elected maintainer)
		-- keep every part of pglease; a role that may only publish gets
		-- nothing, and loses what an earlier version granted it.
		FOR r IN SELECT DISTINCT a.grantee FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
			WHERE p.oid = fn::regprocedure AND a.grantee <> p.proowner
				AND (a.grantee = 0 OR NOT has_table_privilege(a.grantee, msgs, 'DELETE'))
		LOOP
			EXECUTE 'REVOKE EXECUTE ON FUNCTION ' || fn || ' FROM ' || CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END;
		END LOOP;
		FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
			WHERE c.oid = msgs AND a.privilege_type = 'DELETE' AND a.grantee NOT IN (0, c.relowner)
		LOOP
			EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ' || quote_ident(pg_get_userbyid(r.grantee));
		END LOOP;
	END LOOP;
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (7, 'least privilege: the maintainer''s partition DDL through the owner''s SECURITY DEFINER functions') ON CONFLICT (version) DO NOTHING;

-- version 8: hot tables: heartbeats and offset commits as HOT updates (fillfactor, no index on sessions.expires_at)
ALTER TABLE "pglease_consumer_offsets" SET (fillfactor = 10);
ALTER TABLE "pglease_consumer_sessions" SET (fillfactor = 10);
DO $pglease$
DECLARE
	prev text := current_setting('lock_timeout');
BEGIN
	PERFORM set_config('lock_timeout', '2s', true);
	DROP INDEX IF EXISTS "pglease_consumer_sessions_expires_at_idx";
	PERFORM set_config('lock_timeout', prev, true);
END
$pglease$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (8, 'hot tables: heartbeats and offset commits as HOT updates (fillfactor, no index on sessions.expires_at)') ON CONFLICT (version) DO NOTHING;

-- version 9: least privilege: the maintainer's functions accept only whole slots of a class, expire only passed ones, and are executable only by roles that may delete messages
DO $pglease1$
DECLARE
	msgs regclass := to_regclass('"pglease_messages"');
	nsp name;
	owner name;
	fn text;
	fns text[] := '{}';
	r record;
BEGIN
	SELECT n.nspname, pg_get_userbyid(c.relowner) INTO nsp, owner
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % is missing', '"pglease_messages"';
	END IF;
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_add_retention_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint, p_end bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''5s''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	IF p_end IS DISTINCT FROM p_start + width THEN
		RAISE EXCEPTION 'pglease: partition end % is not the end of the slot of class % from %', p_end, p_class, p_start
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = nsp AND c.relname = part) THEN
		RETURN false;
	END IF;
	EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)', nsp, part, nsp, msgs);
	EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (topic, partition, transaction_id, "offset")', nsp, part);
	EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s, to_timestamp(%s)) TO (%s, to_timestamp(%s))',
		nsp, msgs, nsp, part, p_class, p_start, p_class, p_end);
	EXECUTE format('UPDATE %I.%I SET covered_until = $1, updated_at = now() WHERE retention_class = $2 AND covered_until < $1', nsp, retention)
		USING to_timestamp(p_end), p_class::smallint;
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint, bigint)');
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_expire_retention_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''500ms''
		SET TimeZone = ''UTC''
		SET DateStyle = ''ISO''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
	rel oid;
	pending boolean;
	bound text;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	IF to_timestamp(p_start + width) > now() THEN
		RAISE EXCEPTION 'pglease: the slot of class % from % has not passed yet', p_class, to_timestamp(p_start)
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	SELECT c.oid, i.inhdetachpending, pg_get_expr(c.relpartbound, c.oid) INTO rel, pending, bound
	FROM pg_class p
	JOIN pg_namespace pn ON pn.oid = p.relnamespace
	JOIN pg_inherits i ON i.inhparent = p.oid
	JOIN pg_class c ON c.oid = i.inhrelid
	WHERE pn.nspname = nsp AND p.relname = msgs AND c.relnamespace = p.relnamespace AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	-- Only the partition of that slot: one that covers more (made by hand,
	-- or by a role that could call an earlier version of the function
	-- that added any range) holds messages whose slot has not passed.
	IF bound IS DISTINCT FROM format('FOR VALUES FROM (%L, %L) TO (%L, %L)', p_class, to_timestamp(p_start), p_class, to_timestamp(p_start + width)) THEN
		RAISE EXCEPTION 'pglease: %.% covers %, not the slot of class % from %: it is left to the owner', nsp, part, bound, p_class, to_timestamp(p_start)
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF pending THEN
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I FINALIZE', nsp, msgs, nsp, part);
	ELSE
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', nsp, msgs, nsp, part);
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint)');
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_drop_detached_partition');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(p_class integer, p_start bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''5s''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
	rel oid;
	parent oid;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	SELECT p.oid INTO parent FROM pg_class p JOIN pg_namespace pn ON pn.oid = p.relnamespace
	WHERE pn.nspname = nsp AND p.relname = msgs;
	SELECT c.oid INTO rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = nsp AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF parent IS NULL
		OR (SELECT c.relkind <> 'r' OR c.relispartition FROM pg_class c WHERE c.oid = rel)
		OR EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = rel OR inhparent = rel)
		OR (SELECT c.relowner FROM pg_class c WHERE c.oid = rel) NOT IN
			((SELECT p.relowner FROM pg_class p WHERE p.oid = parent), current_user::regrole::oid)
		OR NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = 'expires_at' AND NOT attisdropped)
		OR EXISTS (SELECT 1 FROM pg_attribute x WHERE x.attrelid = rel AND x.attnum > 0 AND NOT x.attisdropped
			AND NOT EXISTS (SELECT 1 FROM pg_attribute y WHERE y.attrelid = parent AND y.attname = x.attname
				AND y.atttypid = x.atttypid AND NOT y.attisdropped))
	THEN
		RAISE EXCEPTION 'pglease: %.% is not a detached retention partition of %.%', nsp, part, nsp, msgs
			USING ERRCODE = 'wrong_object_type';
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END
$pglease$);
	fns := fns || (fn || '(integer, bigint)');
	FOREACH fn IN ARRAY fns LOOP
		EXECUTE 'REVOKE ALL ON FUNCTION ' || fn || ' FROM PUBLIC';
		IF owner <> current_user THEN
			EXECUTE 'ALTER FUNCTION ' || fn || ' OWNER TO ' || quote_ident(owner);
		END IF;
		-- The roles that consume today (and may be elected maintainer)
		-- keep every part of pglease; a role that may only publish gets
		-- nothing, and loses what an earlier version granted it.
		FOR r IN SELECT DISTINCT a.grantee FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
			WHERE p.oid = fn::regprocedure AND a.grantee <> p.proowner
				AND (a.grantee = 0 OR NOT has_table_privilege(a.grantee, msgs, 'DELETE'))
		LOOP
			EXECUTE 'REVOKE EXECUTE ON FUNCTION ' || fn || ' FROM ' || CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END;
		END LOOP;
		FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
			WHERE c.oid = msgs AND a.privilege_type = 'DELETE' AND a.grantee NOT IN (0, c.relowner)
		LOOP
			EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ' || quote_ident(pg_get_userbyid(r.grantee));
		END LOOP;
	END LOOP;
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (9, 'least privilege: the maintainer''s functions accept only whole slots of a class, expire only passed ones, and are executable only by roles that may delete messages') ON CONFLICT (version) DO NOTHING;

-- version 10: parallel delivery: positions acknowledged in a transaction above the committed position
ALTER TABLE "pglease_consumer_offsets"
	ADD COLUMN IF NOT EXISTS acked_above text[] NOT NULL DEFAULT '{}';
INSERT INTO "pglease_schema_version" (version, description) VALUES (10, 'parallel delivery: positions acknowledged in a transaction above the committed position') ON CONFLICT (version) DO NOTHING;

-- version 11: consumer groups: the version of the group's rules each session follows
ALTER TABLE "pglease_consumer_sessions"
	ADD COLUMN IF NOT EXISTS protocol integer NOT NULL DEFAULT 1;
INSERT INTO "pglease_schema_version" (version, description) VALUES (11, 'consumer groups: the version of the group''s rules each session follows') ON CONFLICT (version) DO NOTHING;

-- version 12: limits in the database: positions set by the database, topic name and partition count checks, retention partitions only where the maintainer adds them
DO $pglease1$
DECLARE
	distributed boolean := false;
BEGIN
	CREATE OR REPLACE FUNCTION "pglease_messages_transaction_id"() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog
		AS $pglease$
BEGIN
	-- The owner's import of another system's messages keeps the
	-- positions it computed (see ImportInsertMessages): only a member of
	-- the owner's role that asked for it in its transaction.
	IF pg_catalog.current_setting('pglease.keep_positions', true) = 'on'
		AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
		RETURN NEW;
	END IF;
	NEW.transaction_id := pg_catalog.pg_current_xact_id();
	NEW.created_at := pg_catalog.now();
	RETURN NEW;
END
$pglease$;
	-- Triggers do not check EXECUTE: no role needs it.
	REVOKE ALL ON FUNCTION "pglease_messages_transaction_id"() FROM PUBLIC;
	IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))'
			INTO distributed USING '"pglease_messages"';
	END IF;
	-- A distributed table has the trigger already (DistributeScript): its
	-- function, replaced above, is what changes.
	IF NOT distributed AND NOT EXISTS (SELECT 1 FROM pg_trigger
		WHERE tgrelid = '"pglease_messages"'::regclass AND tgname = 'pglease_messages_transaction_id' AND tgparentid = 0) THEN
		-- Called only for a row that does not hold the defaults already:
		-- an insert that leaves them costs the comparison, not a call.
		CREATE TRIGGER "pglease_messages_transaction_id" BEFORE INSERT ON "pglease_messages"
			FOR EACH ROW
			WHEN (NEW.transaction_id <> pg_catalog.pg_current_xact_id() OR NEW.created_at <> pg_catalog.now())
			EXECUTE FUNCTION "pglease_messages_transaction_id"();
	END IF;
END
$pglease1$;
DO $pglease$
DECLARE
	n bigint;
	r record;
BEGIN
	-- Rows no Publisher or Subscriber can use: a topic name pglease
	-- refuses (empty, longer than 255 bytes).
	DELETE FROM "pglease_topics" WHERE octet_length(topic) NOT BETWEEN 1 AND 255;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		RAISE WARNING 'pglease: deleted % topic settings rows whose topic name is empty or longer than 255 bytes', n;
	END IF;
	FOR r IN UPDATE "pglease_topics" SET partitions = 1024, updated_at = now() WHERE partitions > 1024 RETURNING topic LOOP
		RAISE WARNING 'pglease: topic % had more than 1024 partitions: set to 1024 (messages stored in partitions 1024 and above are not read)',
			quote_literal(r.topic);
	END LOOP;
	DELETE FROM "pglease_delayed" WHERE octet_length(topic) NOT BETWEEN 1 AND 255;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		RAISE WARNING 'pglease: deleted % delayed messages whose topic name is empty or longer than 255 bytes', n;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '"pglease_topics"'::regclass AND conname = 'pglease_topic_limits') THEN
		ALTER TABLE "pglease_topics" ADD CONSTRAINT pglease_topic_limits
			CHECK (octet_length(topic) BETWEEN 1 AND 255 AND partitions BETWEEN 1 AND 1024);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '"pglease_delayed"'::regclass AND conname = 'pglease_topic_limits') THEN
		ALTER TABLE "pglease_delayed" ADD CONSTRAINT pglease_topic_limits
			CHECK (octet_length(topic) BETWEEN 1 AND 255);
	END IF;
	-- Messages no Subscriber reads: of such a topic, or in a partition
	-- above the largest count. Both the delete and the constraint read
	-- the whole table (a partition added later is checked when it is
	-- attached, empty).
	IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '"pglease_messages"'::regclass AND conname = 'pglease_topic_limits') THEN
		DELETE FROM "pglease_messages" WHERE octet_length(topic) NOT BETWEEN 1 AND 255 OR partition NOT BETWEEN 0 AND 1023;
		GET DIAGNOSTICS n = ROW_COUNT;
		IF n > 0 THEN
			RAISE WARNING 'pglease: deleted % messages whose topic name is empty or longer than 255 bytes, or whose partition is not between 0 and 1023', n;
		END IF;
		ALTER TABLE "pglease_messages" ADD CONSTRAINT pglease_topic_limits
			CHECK (octet_length(topic) BETWEEN 1 AND 255 AND partition BETWEEN 0 AND 1023);
	END IF;
END
$pglease$;
DO $pglease1$
DECLARE
	msgs regclass := to_regclass('"pglease_messages"');
	nsp name;
BEGIN
	SELECT n.nspname INTO nsp
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % is missing', '"pglease_messages"';
	END IF;
	-- CREATE OR REPLACE keeps the function's owner and grants (migration 7).
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || quote_ident(nsp) || '.' || quote_ident('pglease_messages_add_retention_partition') || '(p_class integer, p_start bigint, p_end bigint) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''5s''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	msgs constant text := 'pglease_messages';
	retention constant text := 'pglease_retention';
	hash constant text := '512c92c5';
	suffix text;
	part text;
	k integer;
	width bigint;
	topics constant text := 'pglease_topics';
	longest bigint;
	now_s bigint;
BEGIN
	IF p_class IS NULL OR p_class < 1 OR p_class > 62 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 62', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The width of the class's time slots, as retentionSlot computes it;
	-- a partition covers one slot, from a multiple of the width on.
	width := 1::bigint << greatest(0, p_class - 3);
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 - width OR p_start % width <> 0 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds at the start of a slot of class % (% s wide)', p_start, p_class, width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		-- Cut at a character boundary, as PartitionName does.
		k := char_length(msgs);
		WHILE octet_length(convert_to(left(msgs, k), 'UTF8')) > 53 - octet_length(suffix) LOOP
			k := k - 1;
		END LOOP;
		part := left(msgs, k) || '_' || hash || '_' || suffix;
	END IF;
	IF p_end IS DISTINCT FROM p_start + width THEN
		RAISE EXCEPTION 'pglease: partition end % is not the end of the slot of class % from %', p_end, p_class, p_start
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Only a slot the maintainer adds now: of a class a topic has, from
	-- the slot of now (or one that ended at most 10 s ago) to the longest
	-- retention of the class's topics (at most the class's own) and two
	-- slots more.
	EXECUTE format('SELECT ceil(extract(epoch FROM max(t.retention)))::bigint FROM %I.%I t
		WHERE t.retention_class = $1 AND t.retention > interval %L', nsp, topics, '0')
		INTO longest USING p_class;
	IF longest IS NULL THEN
		RAISE EXCEPTION 'pglease: no topic has retention class %', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	longest := least(longest, 1::bigint << (p_class - 1));
	now_s := floor(extract(epoch FROM now()))::bigint;
	IF p_start + width < now_s - 10 OR p_start >= now_s + longest + 3 * width THEN
		RAISE EXCEPTION 'pglease: the slot of class % from % is not one the maintainer adds now (from % to %)',
			p_class, p_start, now_s - 10 - width, now_s + longest + 3 * width
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = nsp AND c.relname = part) THEN
		RETURN false;
	END IF;
	EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', nsp, part, nsp, msgs);
	EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (topic, partition, transaction_id, "offset")', nsp, part);
	EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s, to_timestamp(%s)) TO (%s, to_timestamp(%s))',
		nsp, msgs, nsp, part, p_class, p_start, p_class, p_end);
	EXECUTE format('UPDATE %I.%I SET covered_until = $1, updated_at = now() WHERE retention_class = $2 AND covered_until < $1', nsp, retention)
		USING to_timestamp(p_end), p_class::smallint;
	RETURN true;
END
$pglease$);
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (12, 'limits in the database: positions set by the database, topic name and partition count checks, retention partitions only where the maintainer adds them') ON CONFLICT (version) DO NOTHING;

-- version 13: retention: publishers use a new partition only once no transaction that could route without it runs
-- Publishers place a message in the partitions of its retention class only
-- up to usable_until, which the maintainer raises to covered_until once
-- every transaction that had the messages table open when the partitions
-- were attached has ended: PostgreSQL reads a table's partitions in a
-- transaction when it first locks the table, so such a transaction would
-- route a row for a new partition to none. Existing partitions were
-- attached long before: usable at once.
DO $pglease$
BEGIN
	-- Statements of their own (not one string of several): Citus
	-- propagates a reference table's DDL by its statement's text.
	ALTER TABLE "pglease_retention" ADD COLUMN IF NOT EXISTS usable_until timestamptz;
	UPDATE "pglease_retention" SET usable_until = covered_until WHERE usable_until IS NULL;
	ALTER TABLE "pglease_retention" ALTER COLUMN usable_until SET DEFAULT '-infinity',
		ALTER COLUMN usable_until SET NOT NULL;
END
$pglease$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (13, 'retention: publishers use a new partition only once no transaction that could route without it runs') ON CONFLICT (version) DO NOTHING;

-- version 14: positions held back only by the publishers of the same topic: a sequence, the publishers' registration, the readers' bound (single node)
-- Positions from a sequence, held back only by the transactions that
-- publish to the same topic and partition (docs/decisions/0008). On a
-- single node only: a distributed messages table keeps its workers'
-- transaction ids (DistributeScript's trigger) until the Citus driver
-- moves too.
DO $pglease1$
DECLARE
	distributed boolean := false;
	nsp name;
	seq text;
BEGIN
	IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))'
			INTO distributed USING '"pglease_messages"';
	END IF;
	IF distributed THEN
		RETURN;
	END IF;
	-- Waits for every transaction that inserted with the old trigger to
	-- end, and holds new inserts off until this commits: every row with a
	-- transaction id for its position has committed or aborted when the
	-- sequence starts, above all of them.
	LOCK TABLE "pglease_messages" IN SHARE ROW EXCLUSIVE MODE;
	-- The messages table's schema (with Schema empty, the search_path
	-- decided where it is): the sequence goes there too.
	SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = '"pglease_messages"'::regclass;
	seq := quote_ident(nsp) || '.' || quote_ident('pglease_messages_positions');
	IF to_regclass(seq) IS NULL THEN
		-- CACHE 1: a range cached per backend would hand values out of
		-- the order in which they are taken.
		EXECUTE 'CREATE SEQUENCE ' || seq || ' AS bigint CACHE 1 NO CYCLE';
		-- Above the transaction counter by 2^40, and called (last_value
		-- is a value handed out): a release that reads below the xmin
		-- horizon never reaches the new positions (it stalls, it does
		-- not skip), and this release's bound never passes a value not
		-- yet taken.
		PERFORM pg_catalog.setval(seq::regclass,
			pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint + 1099511627776, true);
	END IF;
	-- Any role may read where the sequence is and take values from it
	-- (what a publisher's trigger does); none but the owner may set it.
	EXECUTE 'GRANT SELECT, USAGE ON SEQUENCE ' || seq || ' TO PUBLIC';
	CREATE OR REPLACE FUNCTION "pglease_messages_take_position"() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog
		AS $pglease$
DECLARE
	k integer;
	mark text;
	registered text;
	v bigint;
	root oid;
BEGIN
	-- Called only for a row that the trigger's WHEN clause does not let
	-- through: a transaction not yet registered for the row's topic and
	-- partition, a position not taken by this row's default (written by
	-- the statement, or taken before the registration), a creation time
	-- written, or the owner's import.
	--
	-- The owner's import of another system's messages keeps the
	-- positions it computed (see ImportInsertMessages): only a member of
	-- the owner's role that asked for it in its transaction.
	IF pg_catalog.current_setting('pglease.keep_positions', true) = 'on'
		AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
		RETURN NEW;
	END IF;
	-- Registration, once per transaction, messages table and key of the
	-- topic and partition: v, the last value the sequence handed out,
	-- then a shared lock on v (tagged in the top byte) and one on the
	-- topic's key (the messages table's oid, the hash), both held to the
	-- end of the transaction. Every position taken after is above v; a
	-- reader that sees the topic's lock reads up to v only (see the
	-- position bound).
	root := COALESCE(pg_catalog.pg_partition_root(TG_RELID), TG_RELID);
	k := pg_catalog.hashtext(NEW.topic || ':' || NEW.partition::text);
	mark := root::text || ':' || k::text || ',';
	registered := pg_catalog.current_setting('pglease.registered', true);
	IF registered IS NULL OR pg_catalog.strpos(registered, ',' || mark) = 0 THEN
		SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v FROM "pglease_messages_positions" s;
		PERFORM pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | v);
		PERFORM pg_catalog.pg_advisory_xact_lock_shared((root::bigint - CASE WHEN root::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer, k);
		PERFORM pg_catalog.set_config('pglease.registered', COALESCE(NULLIF(registered, ''), ',') || mark, true);
	END IF;
	-- A position taken after the registration: the rows that follow,
	-- whose default takes the next, pass the WHEN clause.
	NEW.transaction_id := pg_catalog.nextval('"pglease_messages_positions"'::regclass)::text::xid8;
	NEW.created_at := pg_catalog.now();
	RETURN NEW;
END
$pglease$;
	CREATE OR REPLACE FUNCTION "pglease_messages_position_bound"(topics text[], partitions integer[], OUT bounds bigint[], OUT next bigint)
		LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog
		AS $pglease$
DECLARE
	last bigint;
	called boolean;
	root oid := '"pglease_messages"'::regclass;
BEGIN
	-- The rows read with this bound must be read by a later statement,
	-- with a snapshot of its own taken after this one ended.
	IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'pglease: the position bound needs READ COMMITTED (this transaction is %)',
			pg_catalog.current_setting('transaction_isolation');
	END IF;
	-- First where the sequence is: every value up to last was handed out
	-- (taken by a transaction that had registered) before the locks are
	-- read.
	SELECT s.last_value, s.is_called INTO last, called FROM "pglease_messages_positions" s;
	next := CASE WHEN called THEN last + 1 ELSE last END;
	-- Then the transactions that hold a topic's lock and may write the
	-- messages table (a lock on it, or on one of its partitions, other
	-- than ACCESS SHARE): the bound is just above the lowest v they
	-- registered (their positions are above it), else just above last.
	WITH l AS MATERIALIZED (
		SELECT l.locktype, l.virtualtransaction AS vx, l.classid, l.objid, l.objsubid
		FROM pg_catalog.pg_locks l
		WHERE l.granted AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
			AND (l.locktype = 'advisory' AND (l.objsubid = 2 AND l.classid = root OR l.objsubid = 1 AND l.classid::bigint >> 24 = 112)
				OR l.locktype = 'relation' AND l.mode <> 'AccessShareLock'
					AND (l.relation = root OR l.relation IN (SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root)))
	), writers AS (
		SELECT DISTINCT l.vx FROM l WHERE l.locktype = 'relation'
	), keys AS (
		SELECT l.vx, l.objid::bigint AS k FROM l JOIN writers w ON w.vx = l.vx WHERE l.locktype = 'advisory' AND l.objsubid = 2
	), vs AS (
		SELECT l.vx, ((l.classid::bigint & 16777215) << 32) | l.objid::bigint AS v
		FROM l JOIN writers w ON w.vx = l.vx WHERE l.locktype = 'advisory' AND l.objsubid = 1
	)
	SELECT pg_catalog.array_agg(LEAST(next, (SELECT pg_catalog.min(vs.v) + 1 FROM keys JOIN vs ON vs.vx = keys.vx
			WHERE keys.k = (pg_catalog.hashtext(t.topic || ':' || t.partition::text)::bigint & 4294967295))) ORDER BY t.n)
		INTO bounds
	FROM unnest(topics, partitions) WITH ORDINALITY AS t(topic, partition, n);
END
$pglease$;
	-- They name the sequence and the messages table unqualified, found in
	-- the table's schema: pg_catalog first (no planted function or
	-- operator), temporary objects last (no session's own).
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_take_position"' || '() SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_position_bound"' || '(text[], integer[]) SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	-- Triggers do not check EXECUTE: no role needs it.
	REVOKE ALL ON FUNCTION "pglease_messages_take_position"() FROM PUBLIC;
	-- A row takes its position from its default; the trigger's function
	-- runs only where the WHEN clause cannot tell the position is good:
	-- unless the owner's import asked to keep its own, a row passes when
	-- its position is the last value this session took from the sequence
	-- (currval: so taken by this row's default, after every earlier
	-- row's trigger), its creation time is now(), and its transaction has
	-- registered for its topic and partition (the function's mark, keyed
	-- by the messages table's oid). A position taken before the
	-- registration is not the last value any more: the function takes
	-- another. currval is reached only when the import did not ask: a
	-- statement that writes its own transaction_id in a session that never
	-- took a value fails (currval is not defined yet).
	EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN transaction_id SET DEFAULT pg_catalog.nextval(%L::regclass)::text::xid8',
		'"pglease_messages"'::regclass, seq);
	DROP TRIGGER IF EXISTS "pglease_messages_transaction_id" ON "pglease_messages";
	EXECUTE pg_catalog.format('CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW WHEN (CASE
	WHEN pg_catalog.current_setting(''pglease.keep_positions'', true) OPERATOR(pg_catalog.=) ''on'' THEN true
	ELSE NEW.transaction_id IS DISTINCT FROM pg_catalog.currval(%L::regclass)::text::xid8
		OR NEW.created_at IS DISTINCT FROM pg_catalog.now()
		OR pg_catalog.strpos(COALESCE(pg_catalog.current_setting(''pglease.registered'', true), ''''),
			'','' OPERATOR(pg_catalog.||) (%L::regclass)::oid::text OPERATOR(pg_catalog.||) '':'' OPERATOR(pg_catalog.||)
			pg_catalog.hashtext(NEW.topic OPERATOR(pg_catalog.||) '':'' OPERATOR(pg_catalog.||) NEW.partition::text)::text
			OPERATOR(pg_catalog.||) '','') OPERATOR(pg_catalog.=) 0
	END) EXECUTE FUNCTION %s()',
		'pglease_messages_transaction_id', '"pglease_messages"'::regclass, seq,
		quote_ident(nsp) || '.' || quote_ident('pglease_messages'), '"pglease_messages_take_position"'::regproc);
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (14, 'positions held back only by the publishers of the same topic: a sequence, the publishers'' registration, the readers'' bound (single node)') ON CONFLICT (version) DO NOTHING;

-- version 15: idempotent publish: the idempotency keys of published messages, per topic, forgotten by truncating a day's partition
-- Idempotency keys (see keys.go): the keys of published messages, per
-- topic, in four partitions by generation (a day's slot modulo 4), which
-- the maintainer truncates in turn through the owner's function.
DO $pglease1$
DECLARE
	msgs regclass := to_regclass('"pglease_messages"');
	nsp name;
	owner name;
	keys regclass;
	fn text;
	r record;
	distribute boolean;
BEGIN
	SELECT n.nspname, pg_get_userbyid(c.relowner) INTO nsp, owner
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % is missing', '"pglease_messages"';
	END IF;
	-- key is the first 16 bytes of the SHA-256 of the caller's key; slot
	-- is a day (in Unix days) of the publishing transaction's start: each
	-- key is written for that day and the day before (see keys.go). gen,
	-- the slot modulo 4, is the partition, which the maintainer empties
	-- once its slot is two days old.
	CREATE TABLE IF NOT EXISTS "pglease_messages_keys" (
		topic text COLLATE "C" NOT NULL, -- as the messages table's (Citus co-locates by it)
		key uuid NOT NULL,
		slot bigint NOT NULL,
		gen smallint NOT NULL,
		UNIQUE (topic, key, slot, gen)
	) PARTITION BY LIST (gen);
	CREATE TABLE IF NOT EXISTS "pglease_messages_keys_0" PARTITION OF "pglease_messages_keys" FOR VALUES IN (0);
	CREATE TABLE IF NOT EXISTS "pglease_messages_keys_1" PARTITION OF "pglease_messages_keys" FOR VALUES IN (1);
	CREATE TABLE IF NOT EXISTS "pglease_messages_keys_2" PARTITION OF "pglease_messages_keys" FOR VALUES IN (2);
	CREATE TABLE IF NOT EXISTS "pglease_messages_keys_3" PARTITION OF "pglease_messages_keys" FOR VALUES IN (3);
	keys := to_regclass('"pglease_messages_keys"');
	IF owner <> current_user THEN
		-- The partitions follow their parent.
		EXECUTE 'ALTER TABLE ' || keys::text || ' OWNER TO ' || quote_ident(owner);
		EXECUTE 'ALTER TABLE ' || '"pglease_messages_keys_0"' || ' OWNER TO ' || quote_ident(owner);
		EXECUTE 'ALTER TABLE ' || '"pglease_messages_keys_1"' || ' OWNER TO ' || quote_ident(owner);
		EXECUTE 'ALTER TABLE ' || '"pglease_messages_keys_2"' || ' OWNER TO ' || quote_ident(owner);
		EXECUTE 'ALTER TABLE ' || '"pglease_messages_keys_3"' || ' OWNER TO ' || quote_ident(owner);
	END IF;
	-- Every role that may publish today may publish with keys: INSERT, and
	-- SELECT of the topic and key columns (the insert returns the keys it
	-- wrote).
	FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = msgs AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
	LOOP
		EXECUTE 'GRANT INSERT, SELECT (topic, key) ON TABLE ' || keys::text || ' TO '
			|| CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END;
	END LOOP;
	-- Every role that may run pglease today (it may delete messages, as
	-- GrantSQL lets it) may use the keys as GrantSQL grants them: the
	-- maintainer's check asks for all four.
	FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = msgs AND a.privilege_type = 'DELETE' AND a.grantee <> c.relowner
	LOOP
		EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE ' || keys::text || ' TO '
			|| CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END;
	END LOOP;
	-- The maintainer's function that empties the partition of the keys
	-- two days old: a SECURITY DEFINER function of the owner, executable
	-- by the roles that may delete messages (as those of version 7).
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_forget_keys');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '() RETURNS integer
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''500ms''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	-- The slot (Unix day) of now, and the partition of the slot two days
	-- before: no publisher writes there any more (one whose transaction
	-- began today writes today's slot and yesterday's), and it becomes
	-- today's again only in two days.
	today bigint := floor(extract(epoch FROM now()) / 86400)::bigint;
	gen integer := ((today + 2) % 4)::integer;
	part text := quote_ident(nsp) || '.' || CASE gen WHEN 0 THEN '"pglease_messages_keys_0"' WHEN 1 THEN '"pglease_messages_keys_1"'
		WHEN 2 THEN '"pglease_messages_keys_2"' ELSE '"pglease_messages_keys_3"' END;
	found_one boolean;
BEGIN
	EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || part || ')' INTO found_one;
	IF NOT found_one THEN
		RETURN -1;
	END IF;
	EXECUTE 'TRUNCATE ' || part;
	RETURN gen;
END
$pglease$);
	fn := fn || '()';
	EXECUTE 'REVOKE ALL ON FUNCTION ' || fn || ' FROM PUBLIC';
	IF owner <> current_user THEN
		EXECUTE 'ALTER FUNCTION ' || fn || ' OWNER TO ' || quote_ident(owner);
	END IF;
	FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = msgs AND a.privilege_type = 'DELETE' AND a.grantee NOT IN (0, c.relowner)
	LOOP
		EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ' || quote_ident(pg_get_userbyid(r.grantee));
	END LOOP;
	-- On Citus the keys live with their topic's messages (the catalog
	-- read by EXECUTE: it exists only where Citus is installed).
	IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)
			AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $2)'
			INTO distribute USING msgs, keys;
		IF distribute THEN
			PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
			EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''topic'', colocate_with => $2)'
				USING keys::text, msgs::text;
		END IF;
	END IF;
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (15, 'idempotent publish: the idempotency keys of published messages, per topic, forgotten by truncating a day''s partition') ON CONFLICT (version) DO NOTHING;

-- version 16: failure policy: the messages of a row that failed and wait for their next attempt
-- The failure policy (SubscriberConfig.Retry): the messages of the row
-- that failed and wait for their next attempt, keyed by position
-- ("transaction_id:offset", as acked_above): each an object of the
-- attempts counted ("a"), the first and last failure ("f", "l") and the
-- next attempt ("n"), in milliseconds since the epoch of the server's
-- clock, and the reason given with the last Nack ("r"). Written only by
-- the row's owner, fenced by session and epoch, so it moves with the row
-- to the next owner; empty unless a Subscriber of the group sets Retry.
ALTER TABLE "pglease_consumer_offsets"
	ADD COLUMN IF NOT EXISTS waiting jsonb NOT NULL DEFAULT '{}';
INSERT INTO "pglease_schema_version" (version, description) VALUES (16, 'failure policy: the messages of a row that failed and wait for their next attempt') ON CONFLICT (version) DO NOTHING;

-- version 17: positions: the readers' bound reads pg_locks only for partitions whose key a transaction holds
-- The readers' position bound reads pg_locks (every lock-manager
-- partition, every backend's fast-path slots) only for a partition whose
-- key some transaction holds: for the others, an instant's exclusive
-- lock on the key shows that none does (docs/decisions/0008). The same
-- function, the same result, a new body; a distributed messages table has
-- none.
DO $pglease1$
DECLARE
	nsp name;
BEGIN
	IF to_regprocedure('"pglease_messages_position_bound"' || '(text[], integer[])') IS NULL THEN
		RETURN;
	END IF;
	SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = '"pglease_messages"'::regclass;
	CREATE OR REPLACE FUNCTION "pglease_messages_position_bound"(topics text[], partitions integer[], OUT bounds bigint[], OUT next bigint)
		LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog
		AS $pglease$
DECLARE
	last bigint;
	called boolean;
	root oid := '"pglease_messages"'::regclass;
	rootkey integer;
	registered text;
	k integer;
	fast bigint[] := '{}';
	held boolean := false;
BEGIN
	-- The rows read with this bound must be read by a later statement,
	-- with a snapshot of its own taken after this one ended.
	IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'pglease: the position bound needs READ COMMITTED (this transaction is %)',
			pg_catalog.current_setting('transaction_isolation');
	END IF;
	-- First where the sequence is: every value up to last was handed out
	-- (taken by a transaction that had registered) before the locks are
	-- read.
	SELECT s.last_value, s.is_called INTO last, called FROM "pglease_messages_positions" s;
	next := CASE WHEN called THEN last + 1 ELSE last END;
	-- Then, per partition, whether any transaction holds its key: a
	-- publisher that took a position up to last registered before, so
	-- it holds the key (shared) until it ends. Taking the key exclusively
	-- for an instant (a session lock, released at once) succeeds only if
	-- no other transaction holds it: then every such publisher has
	-- ended, and the bound is just above last, without reading pg_locks.
	-- This transaction's own registrations (a lock of its own does not
	-- conflict) and any key held (by anyone: the filter on writers is
	-- pg_locks's) go the long way below.
	rootkey := (root::bigint - CASE WHEN root::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer;
	registered := COALESCE(pg_catalog.current_setting('pglease.registered', true), '');
	FOR i IN 1 .. COALESCE(pg_catalog.cardinality(topics), 0) LOOP
		k := pg_catalog.hashtext(topics[i] || ':' || partitions[i]::text);
		IF pg_catalog.strpos(registered, ',' || root::text || ':' || k::text || ',') = 0
			AND pg_catalog.pg_try_advisory_lock(rootkey, k) THEN
			PERFORM pg_catalog.pg_advisory_unlock(rootkey, k);
			fast := fast || next;
		ELSE
			held := true;
			EXIT;
		END IF;
	END LOOP;
	IF NOT held THEN
		bounds := fast;
		RETURN;
	END IF;
	-- Then the transactions that hold a topic's lock and may write the
	-- messages table (a lock on it, or on one of its partitions, other
	-- than ACCESS SHARE): the bound is just above the lowest v they
	-- registered (their positions are above it), else just above last.
	WITH l AS MATERIALIZED (
		SELECT l.locktype, l.virtualtransaction AS vx, l.classid, l.objid, l.objsubid
		FROM pg_catalog.pg_locks l
		WHERE l.granted AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
			AND (l.locktype = 'advisory' AND (l.objsubid = 2 AND l.classid = root OR l.objsubid = 1 AND l.classid::bigint >> 24 = 112)
				OR l.locktype = 'relation' AND l.mode <> 'AccessShareLock'
					AND (l.relation = root OR l.relation IN (SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root)))
	), writers AS (
		SELECT DISTINCT l.vx FROM l WHERE l.locktype = 'relation'
	), keys AS (
		SELECT l.vx, l.objid::bigint AS k FROM l JOIN writers w ON w.vx = l.vx WHERE l.locktype = 'advisory' AND l.objsubid = 2
	), vs AS (
		SELECT l.vx, ((l.classid::bigint & 16777215) << 32) | l.objid::bigint AS v
		FROM l JOIN writers w ON w.vx = l.vx WHERE l.locktype = 'advisory' AND l.objsubid = 1
	)
	SELECT pg_catalog.array_agg(LEAST(next, (SELECT pg_catalog.min(vs.v) + 1 FROM keys JOIN vs ON vs.vx = keys.vx
			WHERE keys.k = (pg_catalog.hashtext(t.topic || ':' || t.partition::text)::bigint & 4294967295))) ORDER BY t.n)
		INTO bounds
	FROM unnest(topics, partitions) WITH ORDINALITY AS t(topic, partition, n);
END
$pglease$;
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_position_bound"' || '(text[], integer[]) SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (17, 'positions: the readers'' bound reads pg_locks only for partitions whose key a transaction holds') ON CONFLICT (version) DO NOTHING;

-- version 18: positions: pglease's inserts register their partitions once per statement, and the trigger tests the registration only of inserts that did not
-- pglease's own inserts register their topics and partitions once per
-- statement, before their rows take positions, and say so in a column
-- the trigger's WHEN clause reads without a lookup: the per-row test of
-- the registration mark is left to the inserts that did not register
-- (other releases, an application's own INSERT), which keep the trigger
-- as it was (docs/decisions/0008, "Registered inserts"). A distributed
-- messages table is left as it is.
DO $pglease1$
DECLARE
	distributed boolean := false;
	nsp name;
	seq text;
BEGIN
	IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))'
			INTO distributed USING '"pglease_messages"';
	END IF;
	IF distributed THEN
		RETURN;
	END IF;
	SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = '"pglease_messages"'::regclass;
	seq := quote_ident(nsp) || '.' || quote_ident('pglease_messages_positions');
	-- needs_registration: true (the default) until the trigger's function
	-- registered the row's transaction for its topic and partition, which
	-- then stores NULL; pglease's statement writes NULL itself after it
	-- registered. Rows stored before read NULL: nothing is rewritten.
	ALTER TABLE "pglease_messages" ADD COLUMN IF NOT EXISTS needs_registration boolean;
	ALTER TABLE "pglease_messages" ALTER COLUMN needs_registration SET DEFAULT true;
	CREATE OR REPLACE FUNCTION "pglease_messages_register"(topic text, partitions integer[]) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog
		AS $pglease$
DECLARE
	root oid := '"pglease_messages"'::regclass;
	rootkey integer;
	registered text := COALESCE(pg_catalog.current_setting('pglease.registered', true), '');
	marks text := '';
	mark text;
	k integer;
	p integer;
	v bigint;
BEGIN
	-- The registration for every partition of topic at once: called by
	-- pglease's insert statement before its rows take their positions,
	-- and by the trigger's function (0018_take_position) for a row whose
	-- statement did not. v, the last value the sequence handed out, is
	-- read once, before every position the caller takes; a shared lock
	-- on v (tagged in the top byte) and one on each partition's key,
	-- held to the end of the transaction; the transaction's mark, which
	-- the trigger's WHEN clause reads and after which this function
	-- registers a partition no more.
	rootkey := (root::bigint - CASE WHEN root::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer;
	FOREACH p IN ARRAY partitions LOOP
		k := pg_catalog.hashtext(topic || ':' || p::text);
		mark := root::text || ':' || k::text || ',';
		IF pg_catalog.strpos(registered, ',' || mark) = 0 AND pg_catalog.strpos(marks, ',' || mark) = 0 THEN
			IF v IS NULL THEN
				SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v FROM "pglease_messages_positions" s;
				PERFORM pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | v);
			END IF;
			PERFORM pg_catalog.pg_advisory_xact_lock_shared(rootkey, k);
			marks := CASE WHEN marks = '' THEN ',' ELSE marks END || mark;
		END IF;
	END LOOP;
	IF marks <> '' THEN
		PERFORM pg_catalog.set_config('pglease.registered', COALESCE(NULLIF(registered, ''), ',') || pg_catalog.substr(marks, 2), true);
	END IF;
	RETURN true;
END
$pglease$;
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_register"' || '(text, integer[]) SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	CREATE OR REPLACE FUNCTION "pglease_messages_take_position"() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog
		AS $pglease$
BEGIN
	-- Called only for a row that the trigger's WHEN clause does not let
	-- through: a transaction not yet registered for the row's topic and
	-- partition (by this function, or by pglease's statement: see
	-- needs_registration), a position not taken by this row's default
	-- (written by the statement, or taken before the registration), a
	-- creation time written, or the owner's import. Every row it lets
	-- through stores needs_registration NULL.
	--
	-- The owner's import of another system's messages keeps the
	-- positions it computed (see ImportInsertMessages): only a member of
	-- the owner's role that asked for it in its transaction.
	IF pg_catalog.current_setting('pglease.keep_positions', true) = 'on'
		AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
		NEW.needs_registration := NULL;
		RETURN NEW;
	END IF;
	-- Registration, once per transaction, messages table and key of the
	-- topic and partition, by the function pglease's statements call
	-- themselves (0018_register.plpgsql): every position taken after is
	-- above the v it registered; a reader that sees the topic's lock
	-- reads up to v only (see the position bound).
	PERFORM "pglease_messages_register"(NEW.topic, ARRAY[NEW.partition]);
	-- A position taken after the registration: the rows that follow,
	-- whose default takes the next, pass the WHEN clause.
	NEW.transaction_id := pg_catalog.nextval('"pglease_messages_positions"'::regclass)::text::xid8;
	NEW.created_at := pg_catalog.now();
	NEW.needs_registration := NULL;
	RETURN NEW;
END
$pglease$;
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_take_position"' || '() SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	-- Any role may register (it takes shared advisory locks, which any
	-- role may take itself; readers count only holders that may write the
	-- messages table).
	EXECUTE 'GRANT EXECUTE ON FUNCTION ' || '"pglease_messages_register"' || '(text, integer[]) TO PUBLIC';
	-- The trigger: a row whose statement registered (needs_registration
	-- NULL) passes when its position is the last value this session took
	-- from the sequence (its default's, taken after the statement's
	-- registration) and its creation time is now(); any other row is
	-- tested as before (0014_positions.plpgsql): the owner's import goes
	-- to the function, a row passes when its position and time are its
	-- defaults and its transaction's mark holds its topic key.
	DROP TRIGGER IF EXISTS "pglease_messages_transaction_id" ON "pglease_messages";
	EXECUTE pg_catalog.format('CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW WHEN (CASE
	WHEN NEW.needs_registration IS NULL THEN
		NEW.transaction_id IS DISTINCT FROM pg_catalog.currval(%L::regclass)::text::xid8
		OR NEW.created_at IS DISTINCT FROM pg_catalog.now()
	WHEN pg_catalog.current_setting(''pglease.keep_positions'', true) OPERATOR(pg_catalog.=) ''on'' THEN true
	ELSE NEW.transaction_id IS DISTINCT FROM pg_catalog.currval(%L::regclass)::text::xid8
		OR NEW.created_at IS DISTINCT FROM pg_catalog.now()
		OR pg_catalog.strpos(COALESCE(pg_catalog.current_setting(''pglease.registered'', true), ''''),
			'','' OPERATOR(pg_catalog.||) (%L::regclass)::oid::text OPERATOR(pg_catalog.||) '':'' OPERATOR(pg_catalog.||)
			pg_catalog.hashtext(NEW.topic OPERATOR(pg_catalog.||) '':'' OPERATOR(pg_catalog.||) NEW.partition::text)::text
			OPERATOR(pg_catalog.||) '','') OPERATOR(pg_catalog.=) 0
	END) EXECUTE FUNCTION %s()',
		'pglease_messages_transaction_id', '"pglease_messages"'::regclass, seq, seq,
		quote_ident(nsp) || '.' || quote_ident('pglease_messages'), '"pglease_messages_take_position"'::regproc);
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (18, 'positions: pglease''s inserts register their partitions once per statement, and the trigger tests the registration only of inserts that did not') ON CONFLICT (version) DO NOTHING;

-- version 19: failure policy: how far the row's owner handed messages out, so that a new owner counts their attempts
-- The failure policy (SubscriberConfig.Retry): how far the row's owner
-- has handed messages out, as "transaction_id:offset" (the form of
-- acked_above), NULL when no owner with a policy has. Written, fenced by
-- session and epoch, before the first message of a read goes out, so
-- that the next owner counts one attempt for each message at or below it
-- that has no entry in waiting. Nullable without a default: adding it
-- rewrites nothing, and earlier releases never name it.
ALTER TABLE "pglease_consumer_offsets"
	ADD COLUMN IF NOT EXISTS handed_out text;
INSERT INTO "pglease_schema_version" (version, description) VALUES (19, 'failure policy: how far the row''s owner handed messages out, so that a new owner counts their attempts') ON CONFLICT (version) DO NOTHING;

-- version 20: positions: the trigger's WHEN clause tests only the rows pglease's statements registered; the registration runs no query per step
-- The position machinery's cost per statement: the trigger's WHEN clause
-- is compiled once per statement (and per partition written), so it now
-- holds only the test of the rows pglease's statements register (their
-- position is the session's last value, their time now()); every other
-- row goes to the trigger's function, which lets a row through at once
-- when its position and time are its defaults and its transaction has
-- registered (the test the clause made before). The registration
-- function reads the sequence and takes its locks without a query per
-- step. A distributed messages table is left as it is
-- (docs/decisions/0008, "Cheaper positions").
DO $pglease1$
DECLARE
	distributed boolean := false;
	nsp name;
	seq text;
BEGIN
	IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))'
			INTO distributed USING '"pglease_messages"';
	END IF;
	IF distributed THEN
		RETURN;
	END IF;
	SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = '"pglease_messages"'::regclass;
	seq := quote_ident(nsp) || '.' || quote_ident('pglease_messages_positions');
	CREATE OR REPLACE FUNCTION "pglease_messages_register"(topic text, partitions integer[]) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog
		AS $pglease$
DECLARE
	root oid := '"pglease_messages"'::regclass;
	rootkey integer;
	registered text := COALESCE(pg_catalog.current_setting('pglease.registered', true), '');
	marks text := '';
	mark text;
	k integer;
	p integer;
	v bigint;
	done boolean;
BEGIN
	-- The registration for every partition of topic at once: called by
	-- pglease's insert statement before its rows take their positions,
	-- and by the trigger's function (0020_take_position) for a row whose
	-- statement did not. v, the last value the sequence handed out, is
	-- read once, before every position the caller takes; a shared lock
	-- on v (tagged in the top byte) and one on each partition's key,
	-- held to the end of the transaction; the transaction's mark, which
	-- the trigger's function and the readers' bound read, and after
	-- which this function registers a partition no more. The locks and
	-- the mark are expressions (0018_register took each with PERFORM, a
	-- query each).
	rootkey := (root::bigint - CASE WHEN root::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer;
	FOREACH p IN ARRAY partitions LOOP
		k := pg_catalog.hashtext(topic || ':' || p::text);
		mark := root::text || ':' || k::text || ',';
		IF pg_catalog.strpos(registered, ',' || mark) = 0 AND pg_catalog.strpos(marks, ',' || mark) = 0 THEN
			IF v IS NULL THEN
				-- A query, not pg_sequence_last_value: that takes the
				-- lock nextval takes, the query only ACCESS SHARE
				-- (the conformance case PublisherBetweenLocksAndPosition
				-- holds nextval alone with ALTER SEQUENCE).
				SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v FROM "pglease_messages_positions" s;
				done := pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | v) IS NOT NULL;
			END IF;
			done := pg_catalog.pg_advisory_xact_lock_shared(rootkey, k) IS NOT NULL;
			marks := CASE WHEN marks = '' THEN ',' ELSE marks END || mark;
		END IF;
	END LOOP;
	IF marks <> '' THEN
		done := pg_catalog.set_config('pglease.registered', COALESCE(NULLIF(registered, ''), ',') || pg_catalog.substr(marks, 2), true) IS NOT NULL;
	END IF;
	RETURN true;
END
$pglease$;
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_register"' || '(text, integer[]) SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	CREATE OR REPLACE FUNCTION "pglease_messages_take_position"() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog
		AS $pglease$
DECLARE
	seq regclass := '"pglease_messages_positions"'::regclass;
	root oid := '"pglease_messages"'::regclass;
BEGIN
	-- Called for every row that pglease's statement did not register
	-- (needs_registration not NULL: another release, an application's own
	-- INSERT, the import, the maintainer's moves) and for a registered
	-- row whose position is not the session's last value or whose time
	-- is not now(). Every row it lets through stores needs_registration
	-- NULL.
	--
	-- The owner's import of another system's messages keeps the
	-- positions it computed (see ImportInsertMessages): only a member of
	-- the owner's role that asked for it in its transaction.
	IF pg_catalog.current_setting('pglease.keep_positions', true) = 'on' THEN
		IF pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
			NEW.needs_registration := NULL;
			RETURN NEW;
		END IF;
	-- A row that passes as it is (what the WHEN clause of schema 18
	-- tested): its position is the last value this session took (so
	-- taken by its default, after every earlier row's trigger), its
	-- time now(), and its transaction registered its topic and partition
	-- before (the mark of 0020_register).
	ELSIF NEW.needs_registration IS NOT NULL
		AND NEW.transaction_id = pg_catalog.currval(seq)::text::xid8
		AND NEW.created_at = pg_catalog.now()
		AND pg_catalog.strpos(COALESCE(pg_catalog.current_setting('pglease.registered', true), ''),
			',' || root::text || ':' || pg_catalog.hashtext(NEW.topic || ':' || NEW.partition::text)::text || ',') > 0 THEN
		NEW.needs_registration := NULL;
		RETURN NEW;
	END IF;
	-- Registration, once per transaction, messages table and key of the
	-- topic and partition, by the function pglease's statements call
	-- themselves (0020_register.plpgsql): every position taken after is
	-- above the v it registered; a reader that sees the topic's lock
	-- reads up to v only (see the position bound).
	PERFORM "pglease_messages_register"(NEW.topic, ARRAY[NEW.partition]);
	-- A position taken after the registration: the rows that follow,
	-- whose default takes the next, pass at once.
	NEW.transaction_id := pg_catalog.nextval(seq)::text::xid8;
	NEW.created_at := pg_catalog.now();
	NEW.needs_registration := NULL;
	RETURN NEW;
END
$pglease$;
	EXECUTE 'ALTER FUNCTION ' || '"pglease_messages_take_position"' || '() SET search_path = pg_catalog, '
		|| quote_ident(nsp) || ', pg_temp';
	-- The one position of pglease's statement, taken once its
	-- registration is done (after is the registration's result: the
	-- statement passes it, so that the call follows it). Its body names
	-- the sequence qualified and every type and function in pg_catalog,
	-- so that neither the caller's search_path (a temporary sequence of
	-- the same name) nor a SET clause's cost enters it.
	-- STRICT: a statement with no rows (the maintainer's move when
	-- nothing is due: no registration, after NULL) takes no value.
	EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %s(after boolean) RETURNS pg_catalog.xid8 LANGUAGE plpgsql VOLATILE STRICT AS %L',
		'"pglease_messages_next_position"',
		'BEGIN RETURN pg_catalog.nextval(' || quote_literal(seq) || '::pg_catalog.regclass)::pg_catalog.text::pg_catalog.xid8; END');
	EXECUTE 'GRANT EXECUTE ON FUNCTION ' || '"pglease_messages_next_position"' || '(boolean) TO PUBLIC';
	-- The trigger: a row of a statement that registered (needs_registration
	-- NULL) passes when its position is the last value this session took
	-- from the sequence (taken after the statement's registration) and its
	-- creation time is now(); every other row goes to the function.
	DROP TRIGGER IF EXISTS "pglease_messages_transaction_id" ON "pglease_messages";
	EXECUTE pg_catalog.format('CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW WHEN (
	NEW.needs_registration IS NOT NULL
	OR NEW.transaction_id IS DISTINCT FROM pg_catalog.currval(%L::regclass)::text::xid8
	OR NEW.created_at IS DISTINCT FROM pg_catalog.now()) EXECUTE FUNCTION %s()',
		'pglease_messages_transaction_id', '"pglease_messages"'::regclass, seq, '"pglease_messages_take_position"'::regproc);
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (20, 'positions: the trigger''s WHEN clause tests only the rows pglease''s statements registered; the registration runs no query per step') ON CONFLICT (version) DO NOTHING;

-- version 21: idempotent publish: a topic with a retention longer than a day recognises keys for its retention, in partitions per retention class that the maintainer makes and empties
-- Idempotency keys for the topic's retention (see keys.go): when its key
-- class's partitions may be used (set by the maintainer, which makes them
-- through the owner's function), the maintainer's functions that make
-- them and that forget each class's slot two slots old.
ALTER TABLE "pglease_retention" ADD COLUMN IF NOT EXISTS keys_since timestamptz;
DO $pglease1$
DECLARE
	msgs regclass := to_regclass('"pglease_messages"');
	keys regclass := to_regclass('"pglease_messages_keys"');
	nsp name;
	owner name;
	fn text;
	r record;
BEGIN
	SELECT n.nspname, pg_get_userbyid(c.relowner) INTO nsp, owner
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL OR keys IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % or its keys table is missing', '"pglease_messages"';
	END IF;
	-- The maintainer's function that forgets keys, a new body: it empties
	-- the partition two slots old of every class that has partitions (the
	-- day's included), and returns how many it emptied.
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_forget_keys');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '() RETURNS integer
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''500ms''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || $pglease$
	-- The quoted names of the partitions, by gen + 1 (NULL where none).
	names constant text[] := ARRAY['"pglease_messages_keys_0"', '"pglease_messages_keys_1"', '"pglease_messages_keys_2"', '"pglease_messages_keys_3"', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '"pglease_messages_keys_72"', '"pglease_messages_keys_73"', '"pglease_messages_keys_74"', '"pglease_messages_keys_75"', '"pglease_messages_keys_76"', '"pglease_messages_keys_77"', '"pglease_messages_keys_78"', '"pglease_messages_keys_79"', '"pglease_messages_keys_80"', '"pglease_messages_keys_81"', '"pglease_messages_keys_82"', '"pglease_messages_keys_83"', '"pglease_messages_keys_84"', '"pglease_messages_keys_85"', '"pglease_messages_keys_86"', '"pglease_messages_keys_87"', '"pglease_messages_keys_88"', '"pglease_messages_keys_89"', '"pglease_messages_keys_90"', '"pglease_messages_keys_91"', '"pglease_messages_keys_92"', '"pglease_messages_keys_93"', '"pglease_messages_keys_94"', '"pglease_messages_keys_95"', '"pglease_messages_keys_96"', '"pglease_messages_keys_97"', '"pglease_messages_keys_98"', '"pglease_messages_keys_99"', '"pglease_messages_keys_100"', '"pglease_messages_keys_101"', '"pglease_messages_keys_102"', '"pglease_messages_keys_103"', '"pglease_messages_keys_104"', '"pglease_messages_keys_105"', '"pglease_messages_keys_106"', '"pglease_messages_keys_107"', '"pglease_messages_keys_108"', '"pglease_messages_keys_109"', '"pglease_messages_keys_110"', '"pglease_messages_keys_111"', '"pglease_messages_keys_112"', '"pglease_messages_keys_113"', '"pglease_messages_keys_114"', '"pglease_messages_keys_115"', '"pglease_messages_keys_116"', '"pglease_messages_keys_117"', '"pglease_messages_keys_118"', '"pglease_messages_keys_119"', '"pglease_messages_keys_120"', '"pglease_messages_keys_121"', '"pglease_messages_keys_122"', '"pglease_messages_keys_123"']::text[];
	t constant double precision := extract(epoch FROM now());
	width bigint;
	gen integer;
	part text;
	found_one boolean;
	k integer;
	emptied integer := 0;
BEGIN
	-- Per class (0: the day), the partition of the slot two slots before
	-- now's: no publisher writes there any more (one whose transaction
	-- began in a slot writes that slot and the one before), and it becomes
	-- the current slot's again only in two slots.
	FOR k IN SELECT c FROM unnest(ARRAY[0] || ARRAY(SELECT generate_series(18, 30))) AS c LOOP
		width := CASE WHEN k = 0 THEN 86400 ELSE 1::bigint << (k - 1) END;
		gen := 4 * k + ((floor(t / width)::bigint + 2) % 4)::integer;
		part := quote_ident(nsp) || '.' || names[gen + 1];
		CONTINUE WHEN pg_catalog.to_regclass(part) IS NULL; -- a class never used
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || part || ')' INTO found_one;
		IF found_one THEN
			EXECUTE 'TRUNCATE ' || part;
			emptied := emptied + 1;
		END IF;
	END LOOP;
	RETURN emptied;
END
$pglease$);
	-- The maintainer's function that makes the four partitions of a key
	-- class: a SECURITY DEFINER function of the owner, executable by the
	-- roles that may delete messages (as those of version 7).
	fn := quote_ident(nsp) || '.' || quote_ident('pglease_messages_add_key_partitions');
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(class integer) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ''500ms''
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
	owner constant name := ' || quote_literal(owner) || ';
' || $pglease$
	-- The quoted names of the partitions, by gen + 1 (NULL where none).
	names constant text[] := ARRAY['"pglease_messages_keys_0"', '"pglease_messages_keys_1"', '"pglease_messages_keys_2"', '"pglease_messages_keys_3"', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '"pglease_messages_keys_72"', '"pglease_messages_keys_73"', '"pglease_messages_keys_74"', '"pglease_messages_keys_75"', '"pglease_messages_keys_76"', '"pglease_messages_keys_77"', '"pglease_messages_keys_78"', '"pglease_messages_keys_79"', '"pglease_messages_keys_80"', '"pglease_messages_keys_81"', '"pglease_messages_keys_82"', '"pglease_messages_keys_83"', '"pglease_messages_keys_84"', '"pglease_messages_keys_85"', '"pglease_messages_keys_86"', '"pglease_messages_keys_87"', '"pglease_messages_keys_88"', '"pglease_messages_keys_89"', '"pglease_messages_keys_90"', '"pglease_messages_keys_91"', '"pglease_messages_keys_92"', '"pglease_messages_keys_93"', '"pglease_messages_keys_94"', '"pglease_messages_keys_95"', '"pglease_messages_keys_96"', '"pglease_messages_keys_97"', '"pglease_messages_keys_98"', '"pglease_messages_keys_99"', '"pglease_messages_keys_100"', '"pglease_messages_keys_101"', '"pglease_messages_keys_102"', '"pglease_messages_keys_103"', '"pglease_messages_keys_104"', '"pglease_messages_keys_105"', '"pglease_messages_keys_106"', '"pglease_messages_keys_107"', '"pglease_messages_keys_108"', '"pglease_messages_keys_109"', '"pglease_messages_keys_110"', '"pglease_messages_keys_111"', '"pglease_messages_keys_112"', '"pglease_messages_keys_113"', '"pglease_messages_keys_114"', '"pglease_messages_keys_115"', '"pglease_messages_keys_116"', '"pglease_messages_keys_117"', '"pglease_messages_keys_118"', '"pglease_messages_keys_119"', '"pglease_messages_keys_120"', '"pglease_messages_keys_121"', '"pglease_messages_keys_122"', '"pglease_messages_keys_123"']::text[];
	keys constant text := quote_ident(nsp) || '.' || '"pglease_messages_keys"';
	part text;
	distributed boolean := false;
	made boolean := false;
BEGIN
	IF class IS NULL OR class < 18 OR class > 30 THEN
		RAISE EXCEPTION 'pglease: % is no key class (% to %)', class, 18, 30;
	END IF;
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = pg_catalog.to_regclass($1))'
			INTO distributed USING keys;
	END IF;
	FOR gen IN 4 * class .. 4 * class + 3 LOOP
		part := quote_ident(nsp) || '.' || names[gen + 1];
		CONTINUE WHEN pg_catalog.to_regclass(part) IS NOT NULL;
		-- Made on its own and attached, which takes a SHARE UPDATE
		-- EXCLUSIVE lock on the keys table: publishers go on. On Citus a
		-- partition made as one is distributed with its parent.
		IF distributed THEN
			EXECUTE 'CREATE TABLE ' || part || ' PARTITION OF ' || keys || ' FOR VALUES IN (' || gen || ')';
		ELSE
			EXECUTE 'CREATE TABLE ' || part || ' (LIKE ' || keys || ')';
			EXECUTE 'ALTER TABLE ' || keys || ' ATTACH PARTITION ' || part || ' FOR VALUES IN (' || gen || ')';
		END IF;
		IF owner <> current_user THEN
			EXECUTE 'ALTER TABLE ' || part || ' OWNER TO ' || quote_ident(owner);
		END IF;
		made := true;
	END LOOP;
	RETURN made;
END
$pglease$);
	fn := fn || '(integer)';
	EXECUTE 'REVOKE ALL ON FUNCTION ' || fn || ' FROM PUBLIC';
	IF owner <> current_user THEN
		EXECUTE 'ALTER FUNCTION ' || fn || ' OWNER TO ' || quote_ident(owner);
	END IF;
	FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = msgs AND a.privilege_type = 'DELETE' AND a.grantee NOT IN (0, c.relowner)
	LOOP
		EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ' || quote_ident(pg_get_userbyid(r.grantee));
	END LOOP;
END
$pglease1$;
INSERT INTO "pglease_schema_version" (version, description) VALUES (21, 'idempotent publish: a topic with a retention longer than a day recognises keys for its retention, in partitions per retention class that the maintainer makes and empties') ON CONFLICT (version) DO NOTHING;

-- version 22: idempotent publish: a key window set per topic, for topics without a retention (or a shorter one)
-- Idempotency keys: a window set per topic (TopicConfig.KeyWindow), for
-- topics without a retention or with a shorter one, and its key class
-- (see keys.go). No release before names the columns.
ALTER TABLE "pglease_topics" ADD COLUMN IF NOT EXISTS key_window interval;
ALTER TABLE "pglease_topics" ADD COLUMN IF NOT EXISTS key_class smallint;
INSERT INTO "pglease_schema_version" (version, description) VALUES (22, 'idempotent publish: a key window set per topic, for topics without a retention (or a shorter one)') ON CONFLICT (version) DO NOTHING;
COMMIT;
