"""Gateway logs: the schema and a synthetic log, the line reader, and `scan-logs` (docs/logs.md)."""
