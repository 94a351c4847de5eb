//! Tests of loading: the search order, overrides, and the errors that name key and file.
use std::fs;
use std::time::Duration;

use tempfile::TempDir;

use super::*;

/// The example file at the repository root.
const EXAMPLE: &str = include_str!("../../../../pyvisor.example.toml");

/// A machine of temp dirs: `cwd/`, `home/` (as `HOME`) and `etc/config.toml` as the
/// system file, with no file anywhere yet.
struct Machine {
    root: TempDir,
    vars: BTreeMap<String, OsString>,
}

impl Machine {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("cwd")).unwrap();
        let mut vars = BTreeMap::new();
        vars.insert("HOME".into(), root.path().join("home").into());
        vars.insert("PYVISOR_LOG".into(), "debug".into());
        Self { root, vars }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// Writes `text` to `relative` and returns its path.
    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.path(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        path
    }

    fn set(&mut self, var: &str, value: impl Into<OsString>) -> &mut Self {
        self.vars.insert(var.into(), value.into());
        self
    }

    fn ctx(&self) -> LoadContext {
        LoadContext {
            vars: self.vars.clone(),
            cwd: self.path("cwd"),
            system_file: self.path("etc/config.toml"),
        }
    }

    fn load(&self, explicit: Option<&Path>) -> Result<Loaded, ConfigError> {
        Settings::load_with(explicit, &self.ctx())
    }

    /// The error of loading, as the user sees it.
    fn error(&self, explicit: Option<&Path>) -> String {
        self.load(explicit).unwrap_err().to_string()
    }
}

fn min_idle(n: usize) -> String {
    format!("[pool]\nmin_idle = {n}\n")
}

#[test]
fn example_file_equals_the_defaults() {
    let example: Settings = toml::from_str(EXAMPLE).unwrap();
    assert_eq!(example, Settings::default());
}

#[test]
fn example_file_sets_every_key() {
    let example: Table = EXAMPLE.parse().unwrap();
    for (section, keys) in default_table() {
        let written = example[&section].as_table().unwrap();
        for key in keys.as_table().unwrap().keys() {
            assert!(written.contains_key(key), "{section}.{key} is missing");
        }
    }
}

#[test]
fn defaults_are_valid_and_map_onto_the_engine_defaults() {
    let settings = Settings::default();
    assert_eq!(settings.validate(), Ok(()));
    let engine = settings.engine_config();
    let defaults = EngineConfig::default();
    assert_eq!(engine.pool, defaults.pool);
    assert_eq!(engine.limits, defaults.limits);
    assert_eq!(engine.python, defaults.python);
    assert_eq!(engine.preload, defaults.preload);
    assert_eq!(engine.zygote, defaults.zygote);
    assert_eq!(engine.arbiters, defaults.arbiters);
    assert_eq!(engine.use_cgroups, defaults.use_cgroups);
    assert_eq!(engine.cache_dir, None);
    assert_eq!(engine.handshake_timeout, defaults.handshake_timeout);
    assert_eq!(engine.max_frame_bytes, defaults.max_frame_bytes);
    let (state, default_state) = (engine.state, defaults.state);
    assert_eq!(state.enabled, default_state.enabled);
    assert_eq!(state.dir, None);
    assert_eq!(state.retention, default_state.retention);
    assert_eq!(state.max_bytes, default_state.max_bytes);
    assert_eq!(state.auto, default_state.auto);
    assert_eq!(settings.shutdown_grace(), Duration::from_secs(30));
    assert_eq!(settings.http_addr(), None);
    assert_eq!(settings.token(), None);
}

#[test]
fn no_file_gives_the_defaults() {
    let loaded = Machine::new().load(None).unwrap();
    assert_eq!(loaded.source, None);
    assert_eq!(loaded.settings, Settings::default());
    assert!(loaded.overrides.is_empty());
}

#[test]
fn search_order_takes_the_first_file_that_exists() {
    let mut machine = Machine::new();
    let source = |machine: &Machine| {
        let loaded = machine.load(None).unwrap();
        (loaded.source.unwrap(), loaded.settings.pool.min_idle)
    };
    let system = machine.write("etc/config.toml", &min_idle(1));
    assert_eq!(source(&machine), (system, 1));
    let home = machine.write("home/.config/pyvisor/config.toml", &min_idle(2));
    assert_eq!(source(&machine), (home, 2));
    let xdg = machine.write("xdg/pyvisor/config.toml", &min_idle(3));
    machine.set("XDG_CONFIG_HOME", machine.path("xdg"));
    assert_eq!(source(&machine), (xdg, 3));
    let cwd = machine.write("cwd/pyvisor.toml", &min_idle(4));
    assert_eq!(source(&machine), (cwd, 4));
    let named = machine.write("named.toml", &min_idle(5));
    machine.set(CONFIG_VAR, &named);
    assert_eq!(source(&machine), (named, 5));
    let explicit = machine.write("explicit.toml", &min_idle(6));
    let loaded = machine.load(Some(&explicit)).unwrap();
    assert_eq!(
        (loaded.source.unwrap(), loaded.settings.pool.min_idle),
        (explicit, 6)
    );
}

#[test]
fn relative_xdg_config_home_is_ignored() {
    let mut machine = Machine::new();
    let home = machine.write("home/.config/pyvisor/config.toml", &min_idle(2));
    machine.write("cwd/xdg/pyvisor/config.toml", &min_idle(3));
    machine.set("XDG_CONFIG_HOME", "xdg");
    assert_eq!(machine.load(None).unwrap().source, Some(home));
}

#[test]
fn named_files_must_exist() {
    let mut machine = Machine::new();
    machine.write("cwd/pyvisor.toml", &min_idle(4));
    let missing = machine.path("missing.toml");
    assert_eq!(
        machine.error(Some(&missing)),
        format!(
            "read {}: no such file (named by --config)",
            missing.display()
        )
    );
    machine.set(CONFIG_VAR, &missing);
    assert_eq!(
        machine.error(None),
        format!(
            "read {}: no such file (named by $PYVISOR_CONFIG)",
            missing.display()
        )
    );
}

#[test]
fn explicit_relative_path_starts_from_the_working_directory() {
    let machine = Machine::new();
    let path = machine.write("cwd/mine.toml", &min_idle(7));
    let loaded = machine.load(Some(Path::new("mine.toml"))).unwrap();
    assert_eq!(loaded.source, Some(path));
    assert_eq!(loaded.settings.pool.min_idle, 7);
}

#[test]
fn env_overrides_every_type_on_top_of_the_file() {
    let mut machine = Machine::new();
    machine.write(
        "cwd/pyvisor.toml",
        "[pool]\nmin_idle = 1\nmax_idle = 3\n[engine]\nzygote = true\n",
    );
    machine
        .set("PYVISOR_POOL__MIN_IDLE", "3")
        .set("PYVISOR_POOL__IDLE_TTL_S", "1.5")
        .set("PYVISOR_LIMITS__TIMEOUT_S", "45")
        .set("PYVISOR_ENGINE__ZYGOTE", "0")
        .set("PYVISOR_SERVER__WATCHDOG", "FALSE")
        .set("PYVISOR_STATE__ENABLED", "1")
        .set("PYVISOR_ENGINE__PYTHON", "/opt/py/bin/python3")
        .set("PYVISOR_ENGINE__PRELOAD", "pandas, numpy,")
        .set("PYVISOR_STATE__DIR", "/var/lib/pyvisor")
        .set("PYVISOR_BENCH_QUICK", "1");
    let loaded = machine.load(None).unwrap();
    let settings = &loaded.settings;
    assert_eq!(settings.pool.min_idle, 3);
    assert_eq!(settings.pool.max_idle, 3);
    assert_eq!(settings.pool.idle_ttl_s, 1.5);
    assert_eq!(settings.limits.timeout_s, 45.0);
    assert!(!settings.engine.zygote);
    assert!(!settings.server.watchdog);
    assert!(settings.state.enabled);
    assert_eq!(settings.engine.python, "/opt/py/bin/python3");
    assert_eq!(settings.engine.preload, ["pandas", "numpy"]);
    assert_eq!(settings.state.dir, Path::new("/var/lib/pyvisor"));
    assert_eq!(loaded.overrides.len(), 9);
    assert!(loaded
        .overrides
        .contains(&"PYVISOR_POOL__MIN_IDLE".to_owned()));

    machine.set("PYVISOR_ENGINE__PRELOAD", "");
    assert!(machine
        .load(None)
        .unwrap()
        .settings
        .engine
        .preload
        .is_empty());
}

#[test]
fn unknown_env_key_names_the_variable() {
    let mut machine = Machine::new();
    machine.set("PYVISOR_POOL__MAX_IDEL", "4");
    assert_eq!(
        machine.error(None),
        "environment variable PYVISOR_POOL__MAX_IDEL: unknown key pool.max_idel"
    );
    let mut machine = Machine::new();
    machine.set("PYVISOR_POOLS__MAX_IDLE", "4");
    assert_eq!(
        machine.error(None),
        "environment variable PYVISOR_POOLS__MAX_IDLE: unknown key pools.max_idle"
    );
}

#[test]
fn bad_env_values_name_the_variable() {
    let cases = [
        (
            "PYVISOR_POOL__MIN_IDLE",
            "many",
            "pool.min_idle: expected an integer, got `many`",
        ),
        (
            "PYVISOR_POOL__MIN_IDLE",
            "-1",
            "pool.min_idle: invalid value: integer `-1`",
        ),
        (
            "PYVISOR_ENGINE__ZYGOTE",
            "yes",
            "engine.zygote: expected true, false, 1 or 0",
        ),
        (
            "PYVISOR_LIMITS__TIMEOUT_S",
            "soon",
            "limits.timeout_s: expected a number",
        ),
        (
            "PYVISOR_LIMITS__TIMEOUT_S",
            "0",
            "limits.timeout_s: must be more than 0 seconds",
        ),
        (
            "PYVISOR_POOL__MIN_IDLE",
            "9",
            "pool.max_idle: must be at least pool.min_idle (9)",
        ),
    ];
    for (var, value, expected) in cases {
        let mut machine = Machine::new();
        machine.set(var, value);
        let error = machine.error(None);
        let prefix = format!("environment variable {var}: {expected}");
        assert!(
            error.starts_with(&prefix),
            "{error:?} does not start with {prefix:?}"
        );
    }
}

#[test]
fn unknown_key_in_file_names_file_and_key() {
    let machine = Machine::new();
    let path = machine.write("etc/config.toml", "[pool]\nmin_idle = 2\nmax_idel = 9\n");
    assert_eq!(
        machine.error(None),
        format!("{}: unknown key pool.max_idel", path.display())
    );
    let path = machine.write("etc/config.toml", "[pools]\nmax_idle = 9\n");
    assert_eq!(
        machine.error(None),
        format!("{}: unknown key pools", path.display())
    );
    let path = machine.write("etc/config.toml", "python = \"python3\"\n");
    assert_eq!(
        machine.error(None),
        format!("{}: unknown key python", path.display())
    );
}

#[test]
fn type_errors_in_file_name_file_and_key() {
    let machine = Machine::new();
    let cases = [
        (
            "[pool]\nmin_idle = \"two\"\n",
            "pool.min_idle: invalid type: string \"two\"",
        ),
        (
            "[pool]\nmin_idle = 1.5\n",
            "pool.min_idle: invalid type: floating point `1.5`",
        ),
        (
            "[engine]\npreload = \"pandas\"\n",
            "engine.preload: invalid type: string",
        ),
        (
            "[engine]\nzygote = 1\n",
            "engine.zygote: invalid type: integer `1`",
        ),
        (
            "[state]\nauto_after_changes = 5000000000\n",
            "state.auto_after_changes: invalid value",
        ),
        (
            "[state]\ndurability = \"always\"\n",
            "state.durability: unknown variant `always`, expected `debounced` or `reply`",
        ),
        ("pool = 3\n", "pool: expected a table [pool], got integer"),
    ];
    for (text, expected) in cases {
        let path = machine.write("cwd/pyvisor.toml", text);
        let error = machine.error(None);
        let prefix = format!("{}: {expected}", path.display());
        assert!(
            error.starts_with(&prefix),
            "{error:?} does not start with {prefix:?}"
        );
    }
}

#[test]
fn syntax_errors_give_the_line() {
    let machine = Machine::new();
    let path = machine.write("cwd/pyvisor.toml", "[pool]\nmin_idle = = 2\n");
    let error = machine.error(None);
    let prefix = format!("{}: line 2, column ", path.display());
    assert!(error.starts_with(&prefix), "{error:?}");
}

#[test]
fn out_of_range_values_name_file_and_key() {
    let machine = Machine::new();
    let cases = [
        (
            "[pool]\nmax_idle = 1\n",
            "pool.max_idle: must be at least pool.min_idle (2), got 1",
        ),
        (
            "[pool]\nmin_idle = 9\n",
            "pool.max_idle: must be at least pool.min_idle (9), got 8",
        ),
        (
            "[pool]\nmax_total = 0\n",
            "pool.max_total: must be at least 1, got 0",
        ),
        (
            "[pool]\nacquire_timeout_s = -1\n",
            "pool.acquire_timeout_s: must be more than 0",
        ),
        (
            "[limits]\ntimeout_s = nan\n",
            "limits.timeout_s: must be more than 0",
        ),
        (
            "[limits]\ninput_timeout_s = inf\n",
            "limits.input_timeout_s: must be more than 0",
        ),
        (
            "[limits]\ninterrupt_grace_s = -0.5\n",
            "limits.interrupt_grace_s: must be 0 or more",
        ),
        (
            "[server]\nmax_request_bytes = 100\n",
            "server.max_request_bytes: must be at least 1024",
        ),
        (
            "[server]\ntoken = \"a b\"\n",
            "server.token: must not contain whitespace",
        ),
        (
            "[server]\nhttp = \"localhost\"\n",
            "server.http: expected an address such as",
        ),
        (
            "[engine]\npython = \"\"\n",
            "engine.python: must not be empty",
        ),
        (
            "[state]\nretention = 0\n",
            "state.retention: must be at least 1, got 0",
        ),
        (
            "[memory.embedder]\nbase_url = \"localhost:8080\"\nmodel = \"m\"\n",
            "memory.embedder.base_url: must be an http:// or https:// URL",
        ),
        (
            "[memory.embedder]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\ntimeout_ms = 0\n",
            "memory.embedder.timeout_ms: must be from 1 to 60000, got 0",
        ),
    ];
    for (text, expected) in cases {
        let path = machine.write("cwd/pyvisor.toml", text);
        let error = machine.error(None);
        let prefix = format!("{}: {expected}", path.display());
        assert!(
            error.starts_with(&prefix),
            "{error:?} does not start with {prefix:?}"
        );
    }
}

#[test]
fn zero_durations_are_allowed_where_they_mean_at_once() {
    let machine = Machine::new();
    machine.write(
        "cwd/pyvisor.toml",
        "[server]\nshutdown_grace_s = 0\n[limits]\ninterrupt_grace_s = 0.25\n",
    );
    let settings = machine.load(None).unwrap().settings;
    assert_eq!(settings.shutdown_grace(), Duration::ZERO);
    assert_eq!(
        settings.limits().interrupt_grace,
        Duration::from_millis(250)
    );
}

#[test]
fn resolved_helpers_map_the_values() {
    let machine = Machine::new();
    machine.write(
        "cwd/pyvisor.toml",
        r#"
        [server]
        http = "127.0.0.1:8787"
        token = "s3cret"
        [engine]
        arbiters = 3
        cache_dir = "/var/cache/pyvisor"
        handshake_timeout_s = 2.5
        [pool]
        idle_ttl_s = 0.5
        [limits]
        memory_mb = 0
        cpu_s = 60
        open_files = 0
        processes = 0
        [limits.max]
        memory_mb = 0
        open_files = 0
        processes = 0
        [state]
        dir = "/var/lib/pyvisor"
        auto_after_changes = 0
        durability = "reply"
        "#,
    );
    let settings = machine.load(None).unwrap().settings;
    assert_eq!(
        settings.http_addr(),
        Some("127.0.0.1:8787".parse().unwrap())
    );
    assert_eq!(settings.token(), Some("s3cret"));
    let limits = settings.limits();
    assert_eq!(
        (
            limits.memory_mb,
            limits.cpu_s,
            limits.open_files,
            limits.processes
        ),
        (None, Some(60), None, None)
    );
    assert_eq!(settings.pool_config().idle_ttl, Duration::from_millis(500));
    let engine = settings.engine_config();
    assert_eq!(engine.arbiters, 3);
    assert_eq!(engine.cache_dir, Some(PathBuf::from("/var/cache/pyvisor")));
    assert_eq!(engine.handshake_timeout, Duration::from_millis(2500));
    assert_eq!(engine.state.dir, Some(PathBuf::from("/var/lib/pyvisor")));
    assert_eq!(engine.state.auto.after_changes, 0);
    assert_eq!(engine.state.auto.durability, DurabilityMode::Reply);
    assert_eq!(engine.limits, limits);
}

#[test]
fn the_memory_embedder_section_maps_onto_the_engine() {
    let machine = Machine::new();
    machine.write(
        "cwd/pyvisor.toml",
        "[memory.embedder]\nbase_url = \"http://127.0.0.1:8080/v1\"\nmodel = \"nomic\"\n\
         api_key_env = \"EMBED_KEY\"\ndimensions = 256\n",
    );
    let engine = machine.load(None).unwrap().settings.engine_config();
    let embedder = engine.memory.embedder.expect("an embedder");
    assert_eq!(embedder.base_url, "http://127.0.0.1:8080/v1");
    assert_eq!(embedder.model, "nomic");
    assert_eq!(embedder.api_key_env.as_deref(), Some("EMBED_KEY"));
    assert_eq!(embedder.dimensions, Some(256));
    assert_eq!(embedder.timeout, Duration::from_secs(2));
    machine.write(
        "cwd/pyvisor.toml",
        "[memory.embedder]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\napi_key = \"sk\"\n",
    );
    let error = machine.error(None);
    assert!(error.contains("api_key"), "{error}");
}

#[test]
fn the_client_answered_bridge_needs_no_endpoint_and_checks_its_timeout() {
    let machine = Machine::new();
    let config = machine.load(None).unwrap().settings.engine_config();
    assert_eq!(config.client_llm, crate::config::ClientLlmConfig::default());
    machine.write(
        "cwd/pyvisor.toml",
        "[llm]\nclient_timeout_s = 2.5\nbatch_window_ms = 0\n",
    );
    let config = machine.load(None).unwrap().settings.engine_config();
    assert_eq!(config.llm, None, "no base_url: no engine LLM");
    assert_eq!(config.client_llm.timeout, Duration::from_millis(2500));
    assert_eq!(config.client_llm.batch_window, Duration::ZERO);
    machine.write("cwd/pyvisor.toml", "[llm]\nclient_timeout_s = 0\n");
    let error = machine.error(None);
    assert!(error.contains("llm.client_timeout_s"), "{error}");
}

#[test]
fn the_llm_section_maps_onto_the_engine() {
    let machine = Machine::new();
    assert_eq!(
        machine.load(None).unwrap().settings.engine_config().llm,
        None
    );
    machine.write(
        "cwd/pyvisor.toml",
        "[llm]\nbase_url = \"http://127.0.0.1:8080/v1\"\nmodel = \"big\"\n\
         api_key_env = \"LLM_KEY\"\ntimeout_s = 2.5\nbatch_window_ms = 0\n\
         [llm.prices.\"big\"]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n\
         [llm.models.small]\nmodel = \"tiny-1\"\n\
         [llm.rlm]\nsub_share = 0.25\noutput_chars = 500\n",
    );
    let llm = machine.load(None).unwrap().settings.engine_config().llm;
    let llm = llm.expect("an llm");
    assert_eq!(llm.base_url, "http://127.0.0.1:8080/v1");
    assert_eq!(llm.model, "big");
    assert_eq!(llm.api_key_env.as_deref(), Some("LLM_KEY"));
    assert_eq!(llm.timeout, Duration::from_millis(2500));
    assert_eq!(llm.batch_window, Duration::ZERO);
    assert_eq!(llm.prices["big"].output_per_mtok, 15.0);
    assert_eq!(llm.models["small"], "tiny-1");
    assert_eq!(llm.max_concurrency, 16);
    assert_eq!(llm.rlm.sub_share, 0.25);
    assert_eq!(llm.rlm.output_chars, 500);
    assert_eq!(llm.rlm.max_depth, 2, "the default");
}

#[test]
fn bad_llm_settings_name_the_key() {
    let machine = Machine::new();
    let cases = [
        ("[llm]\napi_key = \"sk-secret\"\n", "llm.api_key"),
        (
            "[llm]\nbase_url = \"ftp://x\"\nmodel = \"m\"\n",
            "llm.base_url",
        ),
        ("[llm]\nbase_url = \"http://x/v1\"\n", "llm.model"),
        (
            "[llm]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\nmax_concurrency = 0\n",
            "llm.max_concurrency",
        ),
        (
            "[llm]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n[llm.prices.m]\n\
             input_per_mtok = -1.0\noutput_per_mtok = 1.0\n",
            "llm.prices",
        ),
        ("[llm.models.small]\nmodel = \"m\"\nkey = \"k\"\n", "key"),
        (
            "[llm]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n[llm.rlm]\nsub_share = 1.5\n",
            "llm.rlm.sub_share",
        ),
        ("[llm.rlm]\nshare = 0.5\n", "share"),
    ];
    for (text, key) in cases {
        machine.write("cwd/pyvisor.toml", text);
        let error = machine.error(None);
        assert!(error.contains(key), "{text}: {error}");
    }
}
