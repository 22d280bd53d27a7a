-- pgstore schema version 2: the foreign keys checked on every appended
-- row are dropped: records to their run, outputs to their record. Each
-- cost a trigger and a FOR KEY SHARE row lock per inserted row (22-29 µs
-- a record here, a tenth of a checkpoint's server time). What they
-- guarded holds without them: every append goes through the compare-and-
-- set of its run's head row in the same statement, which fails for a run
-- that is not there; an output is inserted in the statement of its
-- record; pgstore never deletes a record, an output or a run. The key of
-- outputs to blobs stays: a record must never name bytes the database
-- lacks (Blobs.Put comes first).
ALTER TABLE {s}.records DROP CONSTRAINT records_run_id_fkey;
ALTER TABLE {s}.outputs DROP CONSTRAINT outputs_run_id_seq_fkey;
