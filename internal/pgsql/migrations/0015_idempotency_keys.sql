-- Idempotency keys (see keys.go): the keys of published messages, per
-- topic, in four partitions by generation (a day's slot modulo 4), which
-- the maintainer truncates in turn through the owner's function.
{{do 0015_idempotency_keys.plpgsql}};
