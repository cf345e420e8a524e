"""runner.db's tables, as the migrations that build them (storage/db.py applies them in order).

Append a migration for every change; never edit one that has shipped: a runner's database is
at the version of the last migration it applied.
"""

MIGRATIONS = [
    # 1: the runner's tables
    """
    CREATE TABLE goals (
        id INTEGER PRIMARY KEY,
        text TEXT NOT NULL,
        owner TEXT NOT NULL,
        agent TEXT NOT NULL,
        state TEXT NOT NULL,
        budget TEXT NOT NULL,
        metric TEXT,
        direction TEXT NOT NULL,
        target REAL,
        workspace TEXT NOT NULL,
        created_at TEXT NOT NULL,
        accepted_at TEXT,
        ended_at TEXT,
        end_reason TEXT,
        agent_pid INTEGER,
        agent_report TEXT
    );
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        goal_id INTEGER REFERENCES goals(id),
        ts TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX events_by_goal ON events (goal_id, seq);
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        goal_id INTEGER NOT NULL REFERENCES goals(id),
        idx INTEGER NOT NULL,
        description TEXT NOT NULL,
        command TEXT NOT NULL,
        params TEXT NOT NULL,
        status TEXT NOT NULL,
        metric_name TEXT,
        metric_value REAL,
        metrics TEXT NOT NULL DEFAULT '{}',
        started_at TEXT NOT NULL,
        ended_at TEXT,
        wall_seconds REAL,
        cpu_seconds REAL,
        compute_hours REAL,
        peak_rss_mb REAL,
        exit_code INTEGER,
        log_path TEXT NOT NULL,
        pid INTEGER,
        note TEXT,
        UNIQUE (goal_id, idx)
    );
    CREATE TABLE metrics (
        id INTEGER PRIMARY KEY,
        goal_id INTEGER NOT NULL REFERENCES goals(id),
        experiment_id INTEGER REFERENCES experiments(id),
        name TEXT NOT NULL,
        step REAL,
        value REAL NOT NULL,
        ts TEXT NOT NULL
    );
    CREATE INDEX metrics_by_goal ON metrics (goal_id, name);
    CREATE TABLE approvals (
        id INTEGER PRIMARY KEY,
        goal_id INTEGER NOT NULL REFERENCES goals(id),
        kind TEXT NOT NULL,
        question TEXT NOT NULL,
        detail TEXT NOT NULL,
        state TEXT NOT NULL,
        requested_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        decided_by TEXT,
        decided_at TEXT,
        comment TEXT
    );
    CREATE TABLE inbox (
        id INTEGER PRIMARY KEY,
        goal_id INTEGER NOT NULL REFERENCES goals(id),
        author TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        read_at TEXT
    );
    CREATE TABLE diary (
        id INTEGER PRIMARY KEY,
        goal_id INTEGER NOT NULL REFERENCES goals(id),
        ts TEXT NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE TABLE cursors (
        client TEXT PRIMARY KEY,
        acked_seq INTEGER NOT NULL,
        updated_at TEXT NOT NULL
    );
    """,
    # 2: verified metrics (the runner's own eval command) vs reported ones
    """
    ALTER TABLE experiments ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE experiments ADD COLUMN eval_command TEXT;
    """,
    # 3: the audit trail: control actions and refused attempts, with the authenticated actor (no
    # foreign key: a refused attempt may name a goal that does not exist)
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        ts TEXT NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        goal_id INTEGER,
        outcome TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_by_goal ON audit (goal_id, id);
    """,
    # 4: a goal paused because its disk was full resumes by itself when there is room again (one
    # paused by a person does not)
    """
    ALTER TABLE goals ADD COLUMN paused_for_disk INTEGER NOT NULL DEFAULT 0;
    """,
    # 5: a long history must not slow status: the active goals and the pending approvals are found
    # on an index, not by reading every row
    """
    CREATE INDEX goals_by_state ON goals (state, id);
    CREATE INDEX approvals_by_state ON approvals (state, goal_id);
    """,
    # 6: where each experiment ran and what it held: slots and GPUs on the box (runner/slots.py),
    # Ray or Slurm beyond it (runner/executors.py)
    """
    ALTER TABLE experiments ADD COLUMN executor TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE experiments ADD COLUMN host TEXT;
    ALTER TABLE experiments ADD COLUMN job_id TEXT;
    ALTER TABLE experiments ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE experiments ADD COLUMN devices TEXT;
    ALTER TABLE experiments ADD COLUMN queued_seconds REAL;
    ALTER TABLE experiments ADD COLUMN peak_gpu_memory_mb REAL;
    ALTER TABLE experiments ADD COLUMN gpu_utilization REAL;
    CREATE INDEX experiments_by_status ON experiments (status, goal_id);
    ALTER TABLE goals ADD COLUMN executor TEXT;
    ALTER TABLE goals ADD COLUMN gpus_per_experiment INTEGER;
    """,
    # 7: how far each headline can be trusted (runner/noise.py) and how many seeds it averages
    """
    ALTER TABLE experiments ADD COLUMN interval_low REAL;
    ALTER TABLE experiments ADD COLUMN interval_high REAL;
    ALTER TABLE experiments ADD COLUMN interval_how TEXT;
    ALTER TABLE experiments ADD COLUMN within_noise INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE experiments ADD COLUMN repeats INTEGER NOT NULL DEFAULT 1;
    """,
    # 8: staged goals (their stages and where they are) and what blocks a goal's experiments
    """
    ALTER TABLE goals ADD COLUMN stages TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE goals ADD COLUMN stage INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE goals ADD COLUMN blocked TEXT;
    """,
    # 9: whether an event's stored JSON can be spliced into a replay as it is (its data is JSON, its
    # time needs no escaping), checked once as it is written rather than at every replay. 0, the
    # default, means "not known": such a row is read into its model instead.
    """
    ALTER TABLE events ADD COLUMN plain INTEGER NOT NULL DEFAULT 0;
    UPDATE events SET plain = json_valid(data) AND json_quote(ts) = '"' || ts || '"';
    """,
    # 10: the submitting client's name for a goal (SubmitGoal.key): a submission sent again gets
    # the goal the first made
    """
    ALTER TABLE goals ADD COLUMN submit_key TEXT;
    CREATE UNIQUE INDEX goals_by_submit_key ON goals (submit_key) WHERE submit_key IS NOT NULL;
    """,
    # 11: the runner's identity, a random id made with its database (an existing one is given one
    # here): sent in the welcome, so that the bot tells this database's goals from another's
    """
    CREATE TABLE identity (runner_id TEXT NOT NULL);
    INSERT INTO identity (runner_id) VALUES (lower(hex(randomblob(16))));
    """,
]
