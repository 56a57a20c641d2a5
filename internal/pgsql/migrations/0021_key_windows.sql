-- Idempotency keys for the topic's retention (see keys.go): the
-- partitions of the key classes, the topics whose keys were stored in day
-- slots before, and the maintainer's function that forgets a class's
-- slot two slots old.
{{do 0021_key_windows.plpgsql}};
