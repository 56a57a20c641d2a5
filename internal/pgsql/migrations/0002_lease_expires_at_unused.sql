COMMENT ON COLUMN {{offsets}}.lease_expires_at IS
	'Unused since pglease schema version 2 (always NULL); kept for Subscribers of version 1 during a rolling upgrade.';
