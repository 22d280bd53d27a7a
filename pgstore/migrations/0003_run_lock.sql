-- pgstore schema version 3: no table changes; a change of what sessions
-- do. From this version every session holds its run's advisory lock
-- (key: the first 8 bytes of sha256('runstate/run/' || runs.id))
-- shared from Open to Close, and a session alone on its run may hold it
-- exclusive and send its begins ahead of their replies (ahead.go). A
-- pgstore of version 2 takes no such lock, so a session of it would not
-- keep one of version 3 from having the run alone: the version makes it
-- refuse this schema (Connect: ErrVersion, upgrade the program) instead.
COMMENT ON TABLE {s}.sessions IS 'runstate sessions: each holds its own advisory lock, and its run''s shared (pgstore schema version 3)';
