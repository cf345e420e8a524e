"""storage: the only package that speaks SQL (aiosqlite, WAL, migrations, typed records)."""
