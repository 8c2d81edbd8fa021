"""Gateway logs: what a customer holds of every call, and the checklist that scans them.

- `gateway_log.py`: the log's schema, a reader that never raises on a bad line, and a seeded
  synthetic log of a fictional customer (`data/gateway_logs.jsonl.gz`);
- `scan.py`: the disclosure's customer checklist plus the warning signs (`scan-logs`).
"""
