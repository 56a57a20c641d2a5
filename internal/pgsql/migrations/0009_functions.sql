{{do 0007_functions.plpgsql}};
