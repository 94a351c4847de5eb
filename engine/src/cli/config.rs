//! `pyvisor config check`: load the configuration as the daemon would, and print the
//! effective settings or the error that stops them.

use std::path::PathBuf;

use clap::Subcommand;
use pyvisor::config::Settings;

use super::EXIT_USAGE;

/// The help of every `--config` option: the search order itself, so that no help text sends
/// the reader to another command's.
pub const CONFIG_HELP: &str = "Config file (default: the first that exists of $PYVISOR_CONFIG, \
    ./pyvisor.toml, $XDG_CONFIG_HOME/pyvisor/config.toml (else ~/.config/pyvisor/config.toml), \
    /etc/pyvisor/config.toml; built-in defaults when none does)";

/// Subcommands of `pyvisor config`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file (else the one the search order finds) and print the effective
    /// configuration, environment overrides included.
    Check {
        // The file to check.
        #[arg(value_name = "PATH", help = CONFIG_HELP)]
        path: Option<PathBuf>,
    },
}

pub fn run(command: ConfigCommand) -> u8 {
    match command {
        ConfigCommand::Check { path } => check(path),
    }
}

fn check(path: Option<PathBuf>) -> u8 {
    let loaded = match Settings::load(path.as_deref()) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    // A secret is said to be set, never printed.
    let mut shown = loaded.settings.clone();
    if !shown.server.token.is_empty() {
        shown.server.token = "<set>".into();
    }
    let text = match toml::to_string(&shown) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("pyvisor: failed to print the configuration: {err}");
            return EXIT_USAGE;
        }
    };
    match (&loaded.source, loaded.overrides.is_empty()) {
        (Some(source), _) => println!("# source: {}", source.display()),
        (None, true) => println!("# source: built-in defaults (no config file found)"),
        (None, false) => println!(
            "# source: built-in defaults (no config file found) and the environment overrides below"
        ),
    }
    for var in &loaded.overrides {
        println!("# override: {var}");
    }
    // What the empty ("default") paths resolve to.
    let settings = &loaded.settings;
    let engine = settings.engine_config();
    println!("# resolved socket:    {}", settings.socket_path().display());
    println!("# resolved pid file:  {}", settings.pid_file().display());
    println!("# resolved log file:  {}", settings.log_file().display());
    match &engine.state.dir {
        Some(dir) => println!("# resolved state dir: {}", dir.display()),
        None => match pyvisor::default_state_dir() {
            Ok(dir) => println!("# resolved state dir: {}", dir.display()),
            Err(err) => println!("# resolved state dir: none ({err})"),
        },
    }
    println!("# resolved cache dir: {}", engine.cache_dir().display());
    print!("{text}");
    0
}
