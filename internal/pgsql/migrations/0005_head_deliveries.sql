ALTER TABLE {{offsets}}
	ADD COLUMN IF NOT EXISTS head_deliveries integer NOT NULL DEFAULT 0;
