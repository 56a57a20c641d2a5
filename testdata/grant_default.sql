-- What role "app" needs to run pglease (pglease.GrantSQL); run as the owner of the tables.
BEGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_messages" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_messages_forever" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_consumer_sessions" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_consumer_offsets" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_topics" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_delayed" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_maintenance" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_retention" TO "app";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "pglease_messages_keys" TO "app";
GRANT SELECT ON TABLE "pglease_schema_version" TO "app";
GRANT EXECUTE ON FUNCTION "pglease_messages_add_retention_partition"(integer, bigint, bigint) TO "app";
GRANT EXECUTE ON FUNCTION "pglease_messages_expire_retention_partition"(integer, bigint) TO "app";
GRANT EXECUTE ON FUNCTION "pglease_messages_drop_detached_partition"(integer, bigint) TO "app";
GRANT EXECUTE ON FUNCTION "pglease_messages_forget_keys"() TO "app";
GRANT EXECUTE ON FUNCTION "pglease_messages_add_key_partitions"(integer) TO "app";
DO $pglease$
DECLARE
	r record;
	failed text;
BEGIN
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
		RETURN; -- not Citus
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
		WHERE p.logicalrelid = '"pglease_messages"'::regclass) THEN
		RETURN; -- not distributed (yet: DistributeSQL grants it then)
	END IF;
	FOR r IN SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) AS tab, a.attname AS col,
			'"app"'::text AS grantee
		FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attrelid IN ('"pglease_messages"'::regclass, '"pglease_messages_forever"'::regclass, '"pglease_consumer_sessions"'::regclass, '"pglease_consumer_offsets"'::regclass, '"pglease_topics"'::regclass, '"pglease_delayed"'::regclass, '"pglease_maintenance"'::regclass, '"pglease_retention"'::regclass, '"pglease_messages_keys"'::regclass) AND a.attidentity <> '' AND NOT a.attisdropped
		ORDER BY 1, 2 LOOP
		EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %s', pg_catalog.pg_get_serial_sequence(r.tab, r.col), r.grantee);
		IF true THEN
			SELECT pg_catalog.string_agg(c.nodename || ':' || c.nodeport || ': ' || c.result, '; ') INTO failed
			FROM pg_catalog.run_command_on_workers(pg_catalog.format('DO %L', pg_catalog.format(
				'BEGIN IF pg_catalog.to_regclass(%L) IS NOT NULL THEN EXECUTE pg_catalog.format(%L, pg_catalog.pg_get_serial_sequence(%L, %L), %L); END IF; END',
				r.tab, 'GRANT USAGE ON SEQUENCE %s TO %s', r.tab, r.col, r.grantee))) c
			WHERE NOT c.success;
			IF failed IS NOT NULL THEN
				RAISE EXCEPTION 'pglease: USAGE on the sequence of %.% for % on the workers: %', r.tab, r.col, r.grantee, failed;
			END IF;
		END IF;
	END LOOP;
END
$pglease$;
COMMIT;
