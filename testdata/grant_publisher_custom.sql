-- What role "App ""Role""" needs to publish with pglease (pglease.GrantPublisherSQL); run as the owner of the tables.
BEGIN;
GRANT USAGE ON SCHEMA "My ""App""" TO "App ""Role""";
GRANT INSERT ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz" TO "App ""Role""";
GRANT INSERT ON TABLE "My ""App"""."delayed" TO "App ""Role""";
GRANT SELECT ("due_at") ON TABLE "My ""App"""."delayed" TO "App ""Role""";
GRANT INSERT ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz_keys" TO "App ""Role""";
GRANT SELECT ("topic", "key") ON TABLE "My ""App"""."messages_with_a_rather_long_name_that_needs_shortening_xyz_keys" TO "App ""Role""";
GRANT SELECT ON TABLE "My ""App"""."topics" TO "App ""Role""";
GRANT SELECT ON TABLE "My ""App"""."retention" TO "App ""Role""";
GRANT SELECT ON TABLE "My ""App"""."version" TO "App ""Role""";
COMMIT;
