"""How the fleet names what prefix caches hold: whose prompts an entry may serve (`cache_scope`),
and the chained block hashes under which workers advertise them and placement finds them
(`prefix_blocks`)."""
