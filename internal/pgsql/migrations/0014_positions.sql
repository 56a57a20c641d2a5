-- Positions from a sequence, held back only by the transactions that
-- publish to the same topic and partition (docs/decisions/0008). On a
-- single node only: a distributed messages table keeps its workers'
-- transaction ids (DistributeScript's trigger) until the Citus driver
-- moves too.
{{do 0014_positions.plpgsql}}
