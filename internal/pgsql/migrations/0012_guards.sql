{{do 0012_positions.plpgsql}};
{{do 0012_limits.plpgsql}};
{{do 0012_add_function.plpgsql}};
