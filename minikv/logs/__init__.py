"""Gateway logs: the schema and a synthetic log, a reader of plain or gzip lines and ISO 8601 times, and
`scan-logs`, the disclosure's checklist plus the warning signs (docs/logs.md)."""
