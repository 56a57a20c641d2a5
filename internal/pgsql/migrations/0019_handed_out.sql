-- The failure policy (SubscriberConfig.Retry): how far the row's owner
-- has handed messages out, as "transaction_id:offset" (the form of
-- acked_above), NULL when no owner with a policy has. Written, fenced by
-- session and epoch, before the first message of a read goes out, so
-- that the next owner counts one attempt for each message at or below it
-- that has no entry in waiting. Nullable without a default: adding it
-- rewrites nothing, and earlier releases never name it.
ALTER TABLE {{offsets}}
	ADD COLUMN IF NOT EXISTS handed_out text
