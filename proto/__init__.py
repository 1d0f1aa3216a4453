"""kq's wire protocol: `kq.proto` and the Python code generated from it (never edited by hand)."""
