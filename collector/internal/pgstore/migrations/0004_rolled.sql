-- nodes.rolled_ns: the node's records starting before it are in the
-- minute rollups (node_rollups, run_rollups) and the daily usage
-- (usage_daily, usage_daily_nodes); those starting at or after it are in
-- the raw tables only, until the leader's roll-up adds them and moves it
-- on (docs/storage.md, "Rollups behind ingest"). NULL: none added yet.
-- Written under the node's row lock, as ingest holds it: a record is
-- added once, by ingest (one starting before rolled_ns: a late one) or by
-- the roll-up.
ALTER TABLE nodes ADD COLUMN rolled_ns bigint;

-- The roll-up reads a node's run windows by time.
CREATE INDEX run_windows_node ON run_windows (node, start_ns);
