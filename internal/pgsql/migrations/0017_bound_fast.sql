-- The readers' position bound reads pg_locks (every lock-manager
-- partition, every backend's fast-path slots) only for a partition whose
-- key some transaction holds: for the others, an instant's exclusive
-- lock on the key shows that none does (docs/decisions/0008). The same
-- function, the same result, a new body; a distributed messages table has
-- none.
{{do 0017_bound_fast.plpgsql}}
