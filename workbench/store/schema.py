"""The store's SQLite schema (tables ``runs``, ``metrics``, ``system``, ``results``,
``meta``); columns added later are added on open by :class:`workbench.store.sqlite.Store`.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    profile TEXT NOT NULL,
    idx INTEGER NOT NULL DEFAULT 0,
    model TEXT NOT NULL,
    label TEXT NOT NULL,
    task TEXT NOT NULL,
    seq_len INTEGER,
    seed INTEGER NOT NULL,
    spec TEXT NOT NULL,
    fields TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    device TEXT,
    slot TEXT,
    host TEXT,
    pid INTEGER,
    pid_start REAL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    heartbeat REAL,
    progress REAL NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER,
    epoch INTEGER,
    last_loss REAL,
    last_accuracy REAL,
    backend TEXT,
    error TEXT,
    info TEXT,
    log_path TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE INDEX IF NOT EXISTS runs_profile ON runs(profile);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    step INTEGER NOT NULL,
    epoch REAL,
    split TEXT NOT NULL,          -- 'train' or 'eval'
    name TEXT NOT NULL,           -- 'loss', 'accuracy', 'sequence_accuracy', 'lr', ...
    value REAL,
    t REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics(run_id, split, name, step);
CREATE TABLE IF NOT EXISTS system (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    cpu_percent REAL,
    rss_mb REAL,
    gpu_util REAL,
    gpu_mem_used_mb REAL,
    gpu_mem_total_mb REAL,
    gpu_name TEXT,
    gpu_proc_mem_mb REAL                 -- this run's own GPU memory (NVML, per process)
);
CREATE INDEX IF NOT EXISTS system_run ON system(run_id, t);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    eval_set TEXT NOT NULL DEFAULT '',   -- '' = the default eval set; e.g. 'len=1024'
    name TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, eval_set, name)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""
SCHEMA_VERSION = "1"
TABLES = ("runs", "metrics", "system", "results", "meta")
