"""The `kq` command line: topics, produce, consume, consumer groups and cluster status over `client`.

`cli.main` holds the click group and the one place where errors become a single `kq: error: ...`
line; each noun has its own module (`topics`, `produce`, `consume` with `group_consume` for
`--group`, `groups`, `cluster`), and `output` and `group_output` hold the pure formatting.
"""
