-- Idempotency keys for the topic's retention (see keys.go): when its key
-- class's partitions may be used (set by the maintainer, which makes them
-- through the owner's function), the maintainer's functions that make
-- them and that forget each class's slot two slots old.
ALTER TABLE {{retention}} ADD COLUMN IF NOT EXISTS keys_since timestamptz;
{{do 0021_key_windows.plpgsql}};
