-- pgstore schema version 1. {s} is the schema, quoted. Applied by migrate
-- (schema.go) in one transaction under pg_advisory_xact_lock.
CREATE TABLE {s}.runs (
  id        uuid PRIMARY KEY,
  name      text NOT NULL UNIQUE,
  last_seq  bigint NOT NULL DEFAULT 0,
  last_hash bytea NOT NULL DEFAULT '',
  last_end  bigint NOT NULL DEFAULT 0,
  last_len  bigint NOT NULL DEFAULT 0,
  last_at   timestamptz,
  created   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.records (
  run_id  uuid NOT NULL REFERENCES {s}.runs,
  seq     bigint NOT NULL CHECK (seq > 0),
  line    bytea NOT NULL,
  hash    bytea NOT NULL CHECK (length(hash) = 32),
  ev      text NOT NULL,
  stage   text,
  attempt int,
  key     text,
  session uuid,
  at      timestamptz NOT NULL,
  PRIMARY KEY (run_id, seq)
);
CREATE UNIQUE INDEX one_complete ON {s}.records (run_id, stage, attempt) WHERE ev = 'complete';
CREATE UNIQUE INDEX one_begin ON {s}.records (run_id, stage, attempt) WHERE ev = 'begin';
CREATE TABLE {s}.sessions (
  id       uuid PRIMARY KEY,
  run_id   uuid NOT NULL REFERENCES {s}.runs,
  lock_key bigint NOT NULL UNIQUE,
  host     text,
  pid      int,
  opened   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.blobs (
  sha256 bytea PRIMARY KEY CHECK (length(sha256) = 32),
  size   bigint NOT NULL,
  chunks int NOT NULL
);
CREATE TABLE {s}.blob_chunks (
  sha256 bytea NOT NULL,
  n      int NOT NULL,
  data   bytea NOT NULL,
  PRIMARY KEY (sha256, n)
);
CREATE TABLE {s}.outputs (
  run_id uuid,
  seq    bigint,
  path   text,
  sha256 bytea NOT NULL REFERENCES {s}.blobs,
  size   bigint NOT NULL,
  PRIMARY KEY (run_id, seq, path),
  FOREIGN KEY (run_id, seq) REFERENCES {s}.records
);
CREATE TABLE {s}.projections (
  run_id      uuid PRIMARY KEY REFERENCES {s}.runs,
  seq         bigint NOT NULL DEFAULT 0,   -- the manifest's position
  hash        bytea NOT NULL DEFAULT '',
  "end"       bigint NOT NULL DEFAULT 0,
  last_len    bigint NOT NULL DEFAULT 0,
  crc         boolean NOT NULL DEFAULT false,
  manifest    bytea NOT NULL DEFAULT '',
  handoff_seq bigint NOT NULL DEFAULT 0,   -- the handoff's
  handoff     text NOT NULL DEFAULT '',
  at          timestamptz NOT NULL DEFAULT now()
);
