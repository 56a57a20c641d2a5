-- pglease's own inserts register their topics and partitions once per
-- statement, before their rows take positions, and say so in a column
-- the trigger's WHEN clause reads without a lookup: the per-row test of
-- the registration mark is left to the inserts that did not register
-- (other releases, an application's own INSERT), which keep the trigger
-- as it was (docs/decisions/0008, "Registered inserts"). A distributed
-- messages table is left as it is.
{{do 0018_registered_inserts.plpgsql}}
