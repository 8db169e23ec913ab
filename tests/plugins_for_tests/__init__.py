"""Small plugin modules that tests load by module name or through fake entry points."""
