-- Publishers place a message in the partitions of its retention class only
-- up to usable_until, which the maintainer raises to covered_until once
-- every transaction that had the messages table open when the partitions
-- were attached has ended: PostgreSQL reads a table's partitions in a
-- transaction when it first locks the table, so such a transaction would
-- route a row for a new partition to none. Existing partitions were
-- attached long before: usable at once.
{{do 0013_usable_until.plpgsql}}
