"""The spool's old layout, SQLite (`spool.db`), kept only to convert it: `pairmq spool migrate DIR`.

sql.py    the old schema and its writer's rules as SQL (tests build old spools with it)
load.py   reading and cross-checking an old spool's whole state
migrate.py  an old spool directory -> a checkpoint of the new layout, the old file moved aside
"""
