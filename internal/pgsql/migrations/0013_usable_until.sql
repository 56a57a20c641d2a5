-- Publishers place a message in the partitions of its retention class only
-- up to usable_until, which the maintainer raises to covered_until once
-- every transaction that had the messages table open when the partitions
-- were attached has ended: PostgreSQL reads a table's partitions in a
-- transaction when it first locks the table, so such a transaction would
-- route a row for a new partition to none. Existing partitions were
-- attached long before: usable at once.
ALTER TABLE {{retention}} ADD COLUMN IF NOT EXISTS usable_until timestamptz;
UPDATE {{retention}} SET usable_until = covered_until WHERE usable_until IS NULL;
ALTER TABLE {{retention}} ALTER COLUMN usable_until SET DEFAULT '-infinity',
	ALTER COLUMN usable_until SET NOT NULL
