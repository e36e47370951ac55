-- The collector's tables (docs/storage.md, "PostgreSQL"). Times are Unix
-- nanoseconds (bigint: exact, as the agents send them); identifiers sort
-- bytewise (COLLATE "C"), as the BadgerDB store's keys do.
--
-- Laid out for a fleet (docs/storage.md, "Layout for a fleet"): the raw
-- tables are PARTITIONED BY RANGE on their time column (start_ns, t_ns),
-- one partition a UTC day (<table>_pYYYYMMDD, made by the store as
-- batches need them and by Maintain ahead), dropped whole at the raw
-- retention; run aggregates and the per-minute rollups are kept. Every
-- large table's key holds its distribution column: the node for what a
-- node sends, the run id for run state.

-- applied_batches: one row per batch applied; the primary key is the
-- batch key, so the database itself applies a batch once.
CREATE TABLE applied_batches (
    node     text COLLATE "C" NOT NULL,
    boot     text COLLATE "C" NOT NULL,
    seq      bigint NOT NULL,
    start_ns bigint NOT NULL,
    PRIMARY KEY (node, boot, seq, start_ns)
) PARTITION BY RANGE (start_ns);

-- runs: a run's aggregate (storev1.Aggregate) and, for SQL, its report's
-- figures as plain columns (the run_report view, docs/sql.md), written with
-- the aggregate in one transaction; NULL: unknown. state NULL: a row an
-- ingest transaction holds locked for a run it may create, never committed
-- so.
CREATE TABLE runs (
    run_id          text COLLATE "C" PRIMARY KEY,
    state           bytea,
    start_ns        bigint,
    end_status      text,
    status          text,
    user_name       text,
    end_ns          bigint,
    ended           boolean,
    uid             bigint,
    model           text,
    gpu_name        text,
    labels          jsonb,
    gpus            int,
    nodes           int,
    tokens          bigint,
    wall_s          double precision,
    energy_j        double precision,
    energy_total_j  double precision,
    gpu_hours       double precision,
    cost_usd        double precision,
    energy_cost_usd double precision,
    total_cost_usd  double precision,
    j_per_token     double precision,
    co2_kg          double precision,
    incomplete      boolean
);

CREATE TABLE run_windows (
    run_id   text COLLATE "C" NOT NULL,
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    seq      bigint NOT NULL,
    i        int NOT NULL,
    w        bytea NOT NULL,      -- trainmeter.v1.RunWindow
    PRIMARY KEY (run_id, node, start_ns, seq, i)
) PARTITION BY RANGE (start_ns);

CREATE TABLE run_events (
    run_id text COLLATE "C" NOT NULL,
    node   text COLLATE "C" NOT NULL,
    t_ns   bigint NOT NULL,
    seq    bigint NOT NULL,
    i      int NOT NULL,
    e      bytea NOT NULL,        -- trainmeter.v1.RunEvent
    PRIMARY KEY (run_id, node, t_ns, seq, i)
) PARTITION BY RANGE (t_ns);

-- A batch's GPU and host windows (node_windows), raw samples and node
-- loss records: each a trainmeter.v1.Batch holding only those.
CREATE TABLE node_windows (
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    seq      bigint NOT NULL,
    b        bytea NOT NULL,
    PRIMARY KEY (node, start_ns, seq)
) PARTITION BY RANGE (start_ns);

CREATE TABLE raw_samples (
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    seq      bigint NOT NULL,
    b        bytea NOT NULL,
    PRIMARY KEY (node, start_ns, seq)
) PARTITION BY RANGE (start_ns);

CREATE TABLE node_losses (
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    seq      bigint NOT NULL,
    b        bytea NOT NULL,
    PRIMARY KEY (node, start_ns, seq)
) PARTITION BY RANGE (start_ns);

-- Deleted runs' windows, naming no run (trainmeter.store.v1.DeletedRunWindow):
-- raw windows (seq >= 0) and minute rollups (seq -1) of deleted runs, kept
-- with the aggregates (deletions are rare; usage adds up past the raw
-- retention with them).
CREATE TABLE deleted_windows (
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    seq      bigint NOT NULL,
    i        int NOT NULL,
    deletion bigint NOT NULL,
    d        bytea NOT NULL,
    PRIMARY KEY (node, start_ns, seq, i, deletion)
);

-- A node's status, and its new-run bucket (per-node limits: tokens at
-- new_runs_at, Unix ns; NULL: full). An ingest transaction holds the
-- node's row, so one node's batches apply one after another.
CREATE TABLE nodes (
    node            text COLLATE "C" PRIMARY KEY,
    status          bytea NOT NULL,   -- trainmeter.v1.NodeStatus
    new_runs_tokens double precision,
    new_runs_at     bigint
);

-- The runs live on each node (started there and not ended since), as the
-- runs' aggregates have them: what the per-node limit on live runs counts.
CREATE TABLE live_runs (
    node   text COLLATE "C" NOT NULL,
    run_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (node, run_id)
);

-- The collector's own documents (storage.Records); keys are bytes (some
-- hold NUL separators) and sort bytewise.
CREATE TABLE records (
    ns text COLLATE "C" NOT NULL,
    k  bytea NOT NULL,
    v  bytea NOT NULL,
    PRIMARY KEY (ns, k)
);

-- Per-minute rollups, written in each batch's transaction (under the node's
-- row lock, so read, merged and written back without a race) and kept past
-- the raw retention: usage and timelines read them for the time before
-- raw_horizon. start_ns is the minute (UTC); lock is the price the
-- windows were stored with (rows at different locked prices stay apart).
-- node_rollups.b: a trainmeter.v1.Batch holding per GPU the minute's summed
-- GPU windows, one summed host window and its node loss records (those in
-- a row of its own, lock '\xff').
CREATE TABLE node_rollups (
    node     text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    lock     bytea NOT NULL,
    b        bytea NOT NULL,
    PRIMARY KEY (node, start_ns, lock)
);

-- run_rollups.w: a trainmeter.v1.RunWindow, the sum of a run's windows
-- from one node starting in the minute.
CREATE TABLE run_rollups (
    node     text COLLATE "C" NOT NULL,
    run_id   text COLLATE "C" NOT NULL,
    start_ns bigint NOT NULL,
    lock     bytea NOT NULL,
    w        bytea NOT NULL,
    PRIMARY KEY (node, run_id, start_ns, lock)
);
CREATE INDEX run_rollups_run ON run_rollups (run_id, start_ns);

-- raw_horizon: the raw tables hold every record starting at or after
-- from_ns (the day after the newest day dropped; none dropped: the
-- smallest bigint). Maintain moves it in the transaction that drops.
CREATE TABLE raw_horizon (
    one     bool PRIMARY KEY DEFAULT true CHECK (one),
    from_ns bigint NOT NULL
);
INSERT INTO raw_horizon (from_ns) VALUES (-9223372036854775808);
