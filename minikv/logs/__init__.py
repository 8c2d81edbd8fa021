"""Gateway logs: the schema and a synthetic log, the line and timestamp readers, and `scan-logs` (docs/logs.md)."""
