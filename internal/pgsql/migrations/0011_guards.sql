{{do 0011_positions.plpgsql}};
{{do 0011_limits.plpgsql}};
{{do 0011_add_function.plpgsql}};
