ALTER TABLE {{offsets}} SET (fillfactor = 10);
ALTER TABLE {{sessions}} SET (fillfactor = 10);
{{do 0008_drop_index.plpgsql}};
