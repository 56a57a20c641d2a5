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
COMMIT;
