-- Views a person reads in psql, Grafana's PostgreSQL data source or
-- Metabase (docs/sql.md): run_report, usage_day and usage_day_node. They
-- read plain columns only: the runs table's report columns and the daily
-- usage rollups below, which the collector writes in the transaction that
-- writes the records they sum. NULL is unknown, never 0.

-- usage_daily: a UTC day's usage on a node, one row per GPU and part
-- (kind run: of run ref; idle: of no run, ref ''; deleted: of a run
-- deleted since, ref its deletion id), summed as `trainmeter usage` sums
-- the raw windows of that day (by the window's start). cost_usd sums the
-- parts stored with a price, unpriced counts those stored without one
-- (the row's cost is then unknown). Kept for as long as the database is:
-- the bill outlives the raw windows.
CREATE TABLE usage_daily (
    node        text COLLATE "C" NOT NULL,
    day         date NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('run', 'idle', 'deleted')),
    ref         text COLLATE "C" NOT NULL,
    gpu         int NOT NULL,                  -- -1: not known
    gpu_seconds double precision NOT NULL,
    energy_j    double precision NOT NULL,
    cost_usd    double precision NOT NULL,
    unpriced    int NOT NULL,
    PRIMARY KEY (node, day, kind, ref, gpu)
);
CREATE INDEX usage_daily_run ON usage_daily (ref) WHERE kind = 'run';

-- usage_daily_nodes: a UTC day's totals of a node's GPU windows (with the
-- agent downtime they bridge) and host energy, as usage's nodes.
CREATE TABLE usage_daily_nodes (
    node               text COLLATE "C" NOT NULL,
    day                date NOT NULL,
    gpu_seconds        double precision NOT NULL,
    energy_j           double precision NOT NULL,
    idle_gpu_seconds   double precision NOT NULL,
    idle_energy_j      double precision NOT NULL,
    host_energy_j      double precision NOT NULL,
    idle_host_energy_j double precision NOT NULL,
    PRIMARY KEY (node, day)
);

-- One row a run: its report's figures (report --json) as of the run's
-- last write.
CREATE VIEW run_report AS
SELECT run_id,
       user_name,
       uid,
       model,
       gpu_name,
       labels,
       to_timestamp(start_ns / 1e9) AS start_time,
       to_timestamp(end_ns / 1e9)   AS end_time,
       start_ns,
       end_ns,
       status,
       ended,
       incomplete,
       gpus,
       nodes,
       tokens,
       wall_s,
       energy_j,
       energy_total_j,
       energy_total_j / 3.6e6 AS energy_kwh,
       gpu_hours,
       cost_usd,
       energy_cost_usd,
       total_cost_usd,
       j_per_token,
       co2_kg
FROM runs
WHERE state IS NOT NULL;

-- One row a day, node, GPU and part (a run, idle, a deleted run), with the
-- run's user, model and labels.
CREATE VIEW usage_day AS
SELECT u.day,
       u.day::timestamp AT TIME ZONE 'UTC' AS time,
       u.node,
       NULLIF(u.gpu, -1) AS gpu,
       u.kind,
       CASE WHEN u.kind = 'run' THEN u.ref END     AS run_id,
       CASE WHEN u.kind = 'deleted' THEN u.ref END AS deletion,
       r.user_name,
       r.uid,
       r.model,
       r.labels,
       u.gpu_seconds,
       u.gpu_seconds / 3600 AS gpu_hours,
       u.energy_j,
       u.energy_j / 3.6e6 AS energy_kwh,
       CASE WHEN u.unpriced = 0 THEN u.cost_usd END AS cost_usd
FROM usage_daily u
LEFT JOIN runs r ON u.kind = 'run' AND r.run_id = u.ref AND r.state IS NOT NULL;

-- One row a day and node: the node's totals, its idle part, and the cost
-- of all its rows in usage_day (unknown when any is).
CREATE VIEW usage_day_node AS
SELECT n.day,
       n.day::timestamp AT TIME ZONE 'UTC' AS time,
       n.node,
       n.gpu_seconds / 3600         AS gpu_hours,
       n.energy_j,
       n.energy_j / 3.6e6           AS energy_kwh,
       n.idle_gpu_seconds / 3600    AS idle_gpu_hours,
       n.idle_energy_j,
       n.idle_energy_j / 3.6e6      AS idle_energy_kwh,
       n.host_energy_j,
       n.idle_host_energy_j,
       c.run_gpu_hours,
       c.cost_usd,
       c.idle_cost_usd
FROM usage_daily_nodes n
LEFT JOIN (
    SELECT node, day,
           sum(gpu_seconds) FILTER (WHERE kind <> 'idle') / 3600 AS run_gpu_hours,
           CASE WHEN sum(unpriced) = 0 THEN sum(cost_usd) END AS cost_usd,
           CASE WHEN coalesce(sum(unpriced) FILTER (WHERE kind = 'idle'), 0) = 0
                THEN sum(cost_usd) FILTER (WHERE kind = 'idle') END AS idle_cost_usd
    FROM usage_daily
    GROUP BY node, day
) c ON c.node = n.node AND c.day = n.day;
