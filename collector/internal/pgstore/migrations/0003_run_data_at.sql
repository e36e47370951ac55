-- runs.data_at_ns: when a collector last applied data of the run (a
-- window, an event or a loss record), by its clock, written by the same
-- UPDATE that writes the run's aggregate. The fleet's leader exports the
-- OTel run series of the runs with data in its window (docs/otel.md),
-- whichever replica applied it. Not indexed: an index on a column every
-- batch changes would make each run row's update a non-HOT one, and the
-- leader reads it once per export (a scan of runs).
ALTER TABLE runs ADD COLUMN data_at_ns bigint;
