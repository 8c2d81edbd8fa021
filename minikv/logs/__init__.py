"""Gateway logs (docs/logs.md): the schema and a synthetic log (`gateway_log.py`), the reader of plain or gzip
lines (`line_reader.py`) and of ISO 8601 times (`timestamp.py`), and `scan-logs`, the disclosure's checklist
plus the warning signs (`scan.py`)."""
