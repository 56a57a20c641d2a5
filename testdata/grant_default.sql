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
COMMIT;
