-- The failure policy (SubscriberConfig.Retry): the messages of the row
-- that failed and wait for their next attempt, keyed by position
-- ("transaction_id:offset", as acked_above): each an object of the
-- attempts counted ("a"), the first and last failure ("f", "l") and the
-- next attempt ("n"), in milliseconds since the epoch of the server's
-- clock, and the reason given with the last Nack ("r"). Written only by
-- the row's owner, fenced by session and epoch, so it moves with the row
-- to the next owner; empty unless a Subscriber of the group sets Retry.
ALTER TABLE {{offsets}}
	ADD COLUMN IF NOT EXISTS waiting jsonb NOT NULL DEFAULT '{}'
