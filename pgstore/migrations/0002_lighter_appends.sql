-- pgstore schema version 2: lighter appends (issue 15, bench/README.md).
-- The foreign keys from records to runs and from outputs to records cost
-- each append statement a trigger, a query and a row lock with its WAL
-- record (161 -> 108 us of server time for a one-record append, measured);
-- they guard nothing the append does not: appendSQL writes records and
-- outputs only after its compare-and-set on the run's head row, in the same
-- statement. outputs' key to blobs stays: a complete without its bytes
-- stays impossible. Nothing else changes, so runs written at version 1
-- read and append as before.
ALTER TABLE {s}.records DROP CONSTRAINT records_run_id_fkey;
ALTER TABLE {s}.outputs DROP CONSTRAINT outputs_run_id_seq_fkey;
