"""The `kq` command line: topics, produce, consume and cluster status over the `client` library.

`cli.main` holds the click group and the one place where errors become a single `kq: error: ...`
line; each noun has its own module (`topics`, `produce`, `consume`, `cluster`), and `output` holds
the pure formatting they share.
"""
