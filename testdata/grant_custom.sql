-- What role "App ""Role""" needs to run pglease (pglease.GrantSQL); run as the owner of the tables.
BEGIN;
GRANT USAGE ON SCHEMA "My ""App""" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_sh_05ba50ac_forever" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."Sessions" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."offsets's" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."topics" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."delayed" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."maint" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."retention" TO "App ""Role""";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz_keys" TO "App ""Role""";
GRANT SELECT ON TABLE "My ""App"""."version" TO "App ""Role""";
GRANT EXECUTE ON FUNCTION "My ""App"""."messages_with_a_rather_long_na_05ba50ac_add_retention_partition"(integer, bigint, bigint) TO "App ""Role""";
GRANT EXECUTE ON FUNCTION "My ""App"""."messages_with_a_rather_long_05ba50ac_expire_retention_partition"(integer, bigint) TO "App ""Role""";
GRANT EXECUTE ON FUNCTION "My ""App"""."messages_with_a_rather_long_na_05ba50ac_drop_detached_partition"(integer, bigint) TO "App ""Role""";
GRANT EXECUTE ON FUNCTION "My ""App"""."messages_with_a_rather_long_name_that_need_05ba50ac_forget_keys"() TO "App ""Role""";
GRANT EXECUTE ON FUNCTION "My ""App"""."messages_with_a_rather_long_name_th_05ba50ac_add_key_partitions"(integer) TO "App ""Role""";
DO $pglease$
DECLARE
	r record;
	failed text;
BEGIN
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
		RETURN; -- not Citus
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
		WHERE p.logicalrelid = '"My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz"'::regclass) THEN
		RETURN; -- not distributed (yet: DistributeSQL grants it then)
	END IF;
	FOR r IN SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) AS tab, a.attname AS col,
			'"App ""Role"""'::text AS grantee
		FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attrelid IN ('"My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz"'::regclass, '"My ""App"""."messages_with_a_rather_long_name_that_needs_sh_05ba50ac_forever"'::regclass, '"My ""App"""."Sessions"'::regclass, '"My ""App"""."offsets''s"'::regclass, '"My ""App"""."topics"'::regclass, '"My ""App"""."delayed"'::regclass, '"My ""App"""."maint"'::regclass, '"My ""App"""."retention"'::regclass, '"My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz_keys"'::regclass) AND a.attidentity <> '' AND NOT a.attisdropped
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
